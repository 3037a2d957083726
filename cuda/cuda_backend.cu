// CudaBackend: device memory, copies with format conversion, and the cuBLASLt forward GEMM.
// BF16/FP16 values are stored as real 16-bit data on the GPU (storage_dtype is the
// identity); FP64 has no GPU mode. Methods without a CUDA kernel yet throw, naming the
// method, so a run can never silently fall back to something else.
#include <cstring>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"

namespace st {
namespace {

[[noreturn]] void not_implemented(const char* method) {
  fail("CUDA backend: ", method, " is not implemented yet (issue 7: CUDA kernels)");
}

[[noreturn]] void no_fp64(const char* where) {
  fail("CUDA backend: ", where,
       ": fp64 is not supported on the GPU (the FP64 reference mode "
       "runs on the CPU backend: device = cpu)");
}

// Both tensors on the host: the CPU's RNE conversions, bit-identical to the kernels.
void host_convert(const Tensor& dst, const Tensor& src) {
  const size_t n = static_cast<size_t>(src.numel());
  const DType d = dst.dtype(), s = src.dtype();
  if (s == DType::F32 && d == DType::BF16)
    return convert_f32_to_bf16(src.data<float>(), dst.data<uint16_t>(), n);
  if (s == DType::F32 && d == DType::F16)
    return convert_f32_to_fp16(src.data<float>(), dst.data<uint16_t>(), n);
  if (s == DType::BF16 && d == DType::F32)
    return convert_bf16_to_f32(src.data<uint16_t>(), dst.data<float>(), n);
  if (s == DType::F16 && d == DType::F32)
    return convert_fp16_to_f32(src.data<uint16_t>(), dst.data<float>(), n);
  fail("CUDA backend: copy from ", src.desc(), " to ", dst.desc(),
       " is not supported (supported conversions: fp32 <-> bf16, fp32 <-> fp16)");
}

void check_operand(const Tensor& t, DType storage, const char* what) {
  ST_CHECK(t.device() == Device::CUDA, what, " ", t.desc(), " must be on the GPU");
  ST_CHECK(t.dtype() == storage, what, " ", t.desc(), " must have storage ", dtype_name(storage));
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const char*>(a.raw());
  const auto* pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

CudaBackend::CudaBackend(int device_index) : device_index_(device_index) {
  ST_CUDA_CHECK(cudaSetDevice(device_index));
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  name_ = std::string("cuda:") + prop.name;
  // A blocking stream: work on the legacy default stream still orders with it.
  ST_CUDA_CHECK(cudaStreamCreate(&stream_));
  try {
    gemm_ = std::make_unique<LtGemm>();
  } catch (...) {  // the destructor does not run for a throwing constructor
    ST_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
    throw;
  }
}

CudaBackend::~CudaBackend() {
  ST_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_));
  gemm_.reset();
  ST_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
}

DType CudaBackend::storage_dtype(DType fmt) const {
  if (fmt == DType::F64) no_fp64("storage_dtype");
  return fmt;
}

Tensor CudaBackend::alloc(const Shape& shape, DType storage) {
  if (storage == DType::F64) no_fp64("alloc");
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(storage);
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->device = Device::CUDA;
  if (bytes) {
    try {
      ST_CUDA_CHECK(cudaMalloc(&s->data, bytes));
    } catch (const Error& e) {
      fail("CUDA backend: allocating ", dtype_name(storage), shape_str(shape), " (", bytes,
           " bytes): ", e.what());
    }
  }
  s->deleter = [](void* p) {
    // At process exit the runtime may already be unloaded; the memory is gone with it.
    const cudaError_t e = cudaFree(p);
    if (e != cudaErrorCudartUnloading)
      cuda_detail::check_nothrow(e, "cudaFree(p)", __FILE__, __LINE__);
  };
  return Tensor::wrap(std::move(s), shape, storage);
}

void CudaBackend::zero(const Tensor& t) {
  ST_CHECK(t.defined(), "zero: undefined tensor");
  if (t.nbytes() == 0) return;
  if (t.device() == Device::CUDA) {
    ST_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), stream_));
  } else {
    std::memset(t.raw(), 0, t.nbytes());
  }
}

// Copies that touch host memory are complete when copy() returns; device-to-device copies
// are ordered on the stream like kernels.
void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  ST_CHECK(dst.defined() && src.defined(), "copy: dst ", dst.desc(), ", src ", src.desc());
  ST_CHECK(dst.numel() == src.numel(), "copy: dst ", dst.desc(), " and src ", src.desc(),
           " differ in element count");
  if (dst.numel() == 0) return;
  if (dst.dtype() != src.dtype()) return copy_convert(dst, src);
  const bool to_dev = dst.device() == Device::CUDA, from_dev = src.device() == Device::CUDA;
  if (!to_dev && !from_dev) {
    std::memmove(dst.raw(), src.raw(), dst.nbytes());
    return;
  }
  const cudaMemcpyKind kind = to_dev
                                  ? (from_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                  : cudaMemcpyDeviceToHost;
  ST_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), kind, stream_));
  if (!to_dev || !from_dev) ST_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// Conversions run on the GPU; a host operand is staged through a temporary device buffer
// in the host tensor's own dtype (setup and checkpoint paths, not the training step).
void CudaBackend::copy_convert(const Tensor& dst, const Tensor& src) {
  const bool to_dev = dst.device() == Device::CUDA, from_dev = src.device() == Device::CUDA;
  if (!to_dev && !from_dev) return host_convert(dst, src);
  if (dst.dtype() == DType::F64 || src.dtype() == DType::F64) no_fp64("copy");
  ST_CHECK(cuda_can_convert(dst.dtype(), src.dtype()), "copy from ", src.desc(), " to ", dst.desc(),
           " is not supported (supported conversions: fp32 <-> bf16, fp32 <-> fp16)");
  const size_t n = static_cast<size_t>(dst.numel());
  if (to_dev && from_dev) {
    cuda_convert(dst.raw(), dst.dtype(), src.raw(), src.dtype(), n, stream_);
  } else if (to_dev) {
    Tensor staged = alloc(src.shape(), src.dtype());
    ST_CUDA_CHECK(
        cudaMemcpyAsync(staged.raw(), src.raw(), src.nbytes(), cudaMemcpyHostToDevice, stream_));
    cuda_convert(dst.raw(), dst.dtype(), staged.raw(), src.dtype(), n, stream_);
    ST_CUDA_CHECK(cudaStreamSynchronize(stream_));  // before `staged` is freed
  } else {
    Tensor staged = alloc(dst.shape(), dst.dtype());
    cuda_convert(staged.raw(), dst.dtype(), src.raw(), src.dtype(), n, stream_);
    ST_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), staged.raw(), dst.nbytes(), cudaMemcpyDeviceToHost, stream_));
    ST_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void CudaBackend::synchronize() {
  ST_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// out (N,OC) = inp (N,C) . weight (OC,C)^T + bias (OC). Leading dimensions of inp and out
// are flattened into N, so (B,T,C) activations are accepted as they are.
void CudaBackend::matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias, DType fmt) {
  const DType storage = storage_dtype(fmt);
  ST_CHECK(weight.defined() && weight.ndim() == 2 && weight.dim(0) > 0 && weight.dim(1) > 0,
           "matmul_forward: weight ", weight.desc(), " must be (OC, C)");
  const int64_t OC = weight.dim(0), C = weight.dim(1);
  ST_CHECK(inp.defined() && inp.ndim() >= 1 && inp.dim(-1) == C, "matmul_forward: inp ", inp.desc(),
           " must be (N, ", C, ") for weight ", weight.desc());
  const int64_t N = inp.numel() / C;
  ST_CHECK(out.defined() && out.ndim() >= 1 && out.dim(-1) == OC && out.numel() == N * OC,
           "matmul_forward: out ", out.desc(), " must be (", N, ", ", OC, ") for inp ", inp.desc(),
           " and weight ", weight.desc());
  check_operand(out, storage, "matmul_forward: out");
  check_operand(inp, storage, "matmul_forward: inp");
  check_operand(weight, storage, "matmul_forward: weight");
  if (bias.defined()) {
    check_shape(bias, {OC}, "matmul_forward: bias");
    check_operand(bias, storage, "matmul_forward: bias");
  }
  if (N == 0) return;
  ST_CHECK(!overlaps(out, inp) && !overlaps(out, weight), "matmul_forward: out ", out.desc(),
           " overlaps an input (cuBLASLt cannot run in place)");
  gemm_->run(out.raw(), inp.raw(), weight.raw(), bias.defined() ? bias.raw() : nullptr, N, C, OC,
             storage, stream_);
}

void CudaBackend::encoder_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  DType) {
  not_implemented("encoder_forward");
}
void CudaBackend::encoder_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   DType) {
  not_implemented("encoder_backward");
}
void CudaBackend::layernorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, DType) {
  not_implemented("layernorm_forward");
}
void CudaBackend::layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     DType) {
  not_implemented("layernorm_backward");
}
void CudaBackend::matmul_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, DType) {
  not_implemented("matmul_backward");
}
void CudaBackend::gelu_forward(const Tensor&, const Tensor&, DType) {
  not_implemented("gelu_forward");
}
void CudaBackend::gelu_backward(const Tensor&, const Tensor&, const Tensor&, DType) {
  not_implemented("gelu_backward");
}
void CudaBackend::residual_forward(const Tensor&, const Tensor&, const Tensor&, DType) {
  not_implemented("residual_forward");
}
void CudaBackend::crossentropy_forward_backward(const Tensor&, const Tensor&, const Tensor&,
                                                const Tensor&, int, float, DType) {
  not_implemented("crossentropy_forward_backward");
}
double CudaBackend::sum_squares(const Tensor&) {
  not_implemented("sum_squares");
}
bool CudaBackend::all_finite(const Tensor&) {
  not_implemented("all_finite");
}
void CudaBackend::adamw_update(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const AdamWArgs&, DType) {
  not_implemented("adamw_update");
}
std::unique_ptr<Attention> CudaBackend::make_attention(const AttentionConfig&) {
  not_implemented("make_attention");
}

bool cuda_available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for the next checked call
    return false;
  }
  return n > 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail("device 'cuda' requested but no CUDA device is available (cudaGetDeviceCount: ",
         cudaGetErrorString(e), " [", cudaGetErrorName(e), "])");
  }
  if (n == 0) {
    fail(
        "device 'cuda' requested but no CUDA device is available (cudaGetDeviceCount "
        "found 0 devices)");
  }
  ST_CHECK(device_index >= 0 && device_index < n, "CUDA device index ", device_index,
           " out of range (this machine has ", n, " CUDA device", n == 1 ? "" : "s", ")");
  return std::make_unique<CudaBackend>(device_index);
}

}  // namespace st
