// CudaBackend: device memory (the arena), copies with format conversion, rounding copies and
// the stream; make_attention, which hands out the CUDA attention backends
// (cuda/attention_cuda.h), one per layer; make_cuda_backend. BF16/FP16 values are stored as
// real 16-bit data on the GPU (storage_dtype is the identity); FP64 has no GPU mode. Every
// kernel method (operand checks, then a kernel or cuBLASLt GEMM): cuda/cuda_backend_kernels.cu.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/backends.h"
#include "cuda/attention_cuda.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace st {
namespace {

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
  if (s == DType::F32 && d == DType::F64) {
    const float* a = src.data<float>();
    double* b = dst.data<double>();
    for (size_t i = 0; i < n; ++i) b[i] = a[i];
    return;
  }
  if (s == DType::F64 && d == DType::F32) {
    const double* a = src.data<double>();
    float* b = dst.data<float>();
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<float>(a[i]);
    return;
  }
  fail("CUDA backend: copy from ", src.desc(), " to ", dst.desc(),
       " is not supported (supported conversions: fp32 <-> bf16, fp32 <-> fp16, and fp32 <-> "
       "fp64 on the host)");
}

}  // namespace

void check_device_tensor(const Tensor& t, DType dtype, const char* who, const char* what,
                         size_t align) {
  ST_CHECK(t.defined(), who, ": ", what, " is undefined");
  ST_CHECK(t.device() == Device::CUDA, who, ": ", what, " ", t.desc(), " must be on the GPU");
  ST_CHECK(t.dtype() == dtype, who, ": ", what, " ", t.desc(), " must have storage ",
           dtype_name(dtype));
  ST_CHECK(reinterpret_cast<uintptr_t>(t.raw()) % align == 0, who, ": ", what, " ", t.desc(),
           " must be ", align, "-byte aligned");
}

CudaBackend::CudaBackend(int device_index) : device_index_(device_index) {
  ST_CUDA_CHECK(cudaSetDevice(device_index));
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  name_ = std::string("cuda:") + prop.name;
  // A blocking stream: work on the legacy default stream still orders with it.
  ST_CUDA_CHECK(cudaStreamCreate(&stream_));
  try {
    arena_ = std::make_shared<DeviceArena>(device_index);
    gemm_ = std::make_unique<LtGemm>();
    ST_CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
    ST_CUDA_CHECK(cudaMallocHost(&pinned_result_, 256));
  } catch (...) {  // the destructor does not run for a throwing constructor
    if (staged_) ST_CUDA_CHECK_NOTHROW(cudaEventDestroy(staged_));
    gemm_.reset();
    arena_.reset();
    ST_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
    throw;
  }
}

CudaBackend::~CudaBackend() {
  ST_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_));
  cudnn_state_.reset();  // its plans and workspace hold arena memory and the stream
  gemm_.reset();
  if (staging_) ST_CUDA_CHECK_NOTHROW(cudaFreeHost(staging_));
  if (pinned_result_) ST_CUDA_CHECK_NOTHROW(cudaFreeHost(pinned_result_));
  if (staged_) ST_CUDA_CHECK_NOTHROW(cudaEventDestroy(staged_));
  arena_.reset();  // chunks go back once no tensor holds memory from them
  ST_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
}

DType CudaBackend::storage_dtype(DType fmt) const {
  if (fmt == DType::F64) no_fp64("storage_dtype");
  ST_CHECK(fmt == DType::F32 || fmt == DType::BF16 || fmt == DType::F16, "CUDA backend: format ",
           dtype_name(fmt), " is not a compute format");
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
      s->data = arena_->allocate(bytes);
    } catch (const Error& e) {
      fail("CUDA backend: allocating ", dtype_name(storage), shape_str(shape), " (", bytes,
           " bytes): ", e.what());
    }
    std::shared_ptr<DeviceArena> arena = arena_;
    s->deleter = [arena](void* p) { arena->release(p); };
  }
  return Tensor::wrap(std::move(s), shape, storage);
}

std::shared_ptr<Storage> CudaBackend::scratch(size_t bytes) {
  auto s = std::make_shared<Storage>();
  s->bytes = std::max<size_t>(bytes, 1);
  s->device = Device::CUDA;
  s->data = arena_->allocate(s->bytes);
  std::shared_ptr<DeviceArena> arena = arena_;
  s->deleter = [arena](void* p) { arena->release(p); };
  return s;
}

std::shared_ptr<Storage> CudaBackend::upload_ints(const int32_t* host, size_t n) {
  const size_t bytes = n * sizeof(int32_t);
  auto dev = scratch(bytes);
  if (bytes == 0) return dev;
  // The previous upload from the staging buffer must have left it before it is rewritten.
  ST_CUDA_CHECK(cudaEventSynchronize(staged_));
  if (bytes > staging_bytes_) {
    if (staging_) ST_CUDA_CHECK(cudaFreeHost(staging_));
    staging_ = nullptr;
    staging_bytes_ = 0;
    const size_t want = std::max<size_t>(bytes, size_t{64} << 10);
    ST_CUDA_CHECK(cudaMallocHost(&staging_, want));
    staging_bytes_ = want;
  }
  std::memcpy(staging_, host, bytes);
  ST_CUDA_CHECK(cudaMemcpyAsync(dev->data, staging_, bytes, cudaMemcpyHostToDevice, stream_));
  ST_CUDA_CHECK(cudaEventRecord(staged_, stream_));
  return dev;
}

const void* CudaBackend::fetch_small(const void* dev, size_t bytes) {
  ST_CHECK(bytes <= 256, "fetch_small: ", bytes, " bytes");
  ST_CUDA_CHECK(cudaMemcpyAsync(pinned_result_, dev, bytes, cudaMemcpyDeviceToHost, stream_));
  ST_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return pinned_result_;
}

MemoryStats CudaBackend::memory() const {
  const ArenaStats a = arena_->stats();
  MemoryStats m;
  m.in_use = a.in_use_bytes;
  m.peak = a.peak_in_use_bytes;
  m.reserved = a.reserved_bytes;
  return m;
}

void CudaBackend::reset_peak_memory() { arena_->reset_peak(); }

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
// Device -> host fp64 (the model reads the FP32 losses into fp64) widens exactly through
// host fp32; host fp64 -> device would narrow and is refused.
void CudaBackend::copy_convert(const Tensor& dst, const Tensor& src) {
  const bool to_dev = dst.device() == Device::CUDA, from_dev = src.device() == Device::CUDA;
  if (!to_dev && !from_dev) return host_convert(dst, src);
  const int64_t n64 = dst.numel();
  if (!to_dev && dst.dtype() == DType::F64) {
    Tensor f32 = Tensor::empty({n64}, DType::F32);
    copy(f32, src.view({n64}));
    return host_convert(dst, f32.view(dst.shape()));
  }
  if (dst.dtype() == DType::F64 || src.dtype() == DType::F64) no_fp64("copy");
  ST_CHECK(cuda_can_convert(dst.dtype(), src.dtype()), "copy from ", src.desc(), " to ", dst.desc(),
           " is not supported (supported conversions: fp32 <-> bf16, fp32 <-> fp16)");
  const size_t n = static_cast<size_t>(n64);
  if (to_dev && from_dev) {
    cuda_convert(dst.raw(), dst.dtype(), src.raw(), src.dtype(), n, stream_);
  } else if (to_dev) {
    Tensor staged = alloc(src.shape(), src.dtype());
    ST_CUDA_CHECK(
        cudaMemcpyAsync(staged.raw(), src.raw(), src.nbytes(), cudaMemcpyHostToDevice, stream_));
    cuda_convert(dst.raw(), dst.dtype(), staged.raw(), src.dtype(), n, stream_);
    ST_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host source must outlive the copy
  } else {
    Tensor staged = alloc(dst.shape(), dst.dtype());
    cuda_convert(staged.raw(), dst.dtype(), src.raw(), src.dtype(), n, stream_);
    ST_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), staged.raw(), dst.nbytes(), cudaMemcpyDeviceToHost, stream_));
    ST_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

// dst <- round_fmt(src): the copy rounds already when dst's storage is fmt; FP32 storage
// holding fmt values (the CPU's convention) is rounded in place after the copy.
void CudaBackend::round_copy(const Tensor& dst, const Tensor& src, DType fmt) {
  if (fmt == DType::F64) no_fp64("round_copy");
  copy(dst, src);
  if (dst.dtype() != DType::F32 || fmt == DType::F32 || dst.numel() == 0) return;
  if (dst.device() == Device::CUDA) {
    cudak::round_inplace(static_cast<float*>(dst.raw()), static_cast<size_t>(dst.numel()), fmt,
                         stream_);
  } else {
    round_inplace(fmt, dst.data<float>(), static_cast<size_t>(dst.numel()));
  }
}

void CudaBackend::synchronize() {
  ST_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::unique_ptr<Attention> CudaBackend::make_attention(const AttentionConfig& cfg) {
  if (cfg.kind == AttentionKind::Baseline) return make_attention_cuda_baseline(*this, cfg);
  if (cfg.kind == AttentionKind::Cudnn) return make_attention_cuda_cudnn(*this, cfg);
  return make_attention_cuda_flash(*this, cfg);
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
