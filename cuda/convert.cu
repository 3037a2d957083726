// Storage-format conversion kernels used by CudaBackend::copy: FP32 <-> BF16/FP16.
// FP32 -> 16-bit rounds to nearest even with the CUDA intrinsics (__float2bfloat16_rn,
// __float2half_rn: NaN -> 0x7FFF, overflow -> Inf, subnormals kept), which core/dtype.h
// reproduces bit for bit on the CPU. 16-bit -> FP32 is exact.
// Grid-stride loops; four elements per thread in one vector load/store when the
// pointers allow it, so the kernels run at memory bandwidth.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/launch.cuh"

namespace st {
namespace {

struct F32ToBF16 {
  using In = float;
  using Out = uint16_t;
  __device__ Out operator()(In x) const { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
};
struct BF16ToF32 {
  using In = uint16_t;
  using Out = float;
  __device__ Out operator()(In h) const { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
};
struct F32ToF16 {
  using In = float;
  using Out = uint16_t;
  __device__ Out operator()(In x) const { return __half_as_ushort(__float2half_rn(x)); }
};
struct F16ToF32 {
  using In = uint16_t;
  using Out = float;
  __device__ Out operator()(In h) const {
    // NaN payloads are hardware-defined in cvt.f32.f16; pin them to fp16_bits_to_float's
    // (sign, all-ones exponent, mantissa << 13) so GPU and CPU agree bit for bit.
    if ((h & 0x7fffu) > 0x7c00u) {
      return __uint_as_float((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7f800000u |
                             (static_cast<uint32_t>(h & 0x3ffu) << 13));
    }
    return __half2float(__ushort_as_half(h));
  }
};

template <class T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// Elements [0, 4*n4) go through aligned Vec4 loads/stores, the rest one at a time.
// n4 is 0 when either pointer is not aligned for the vector path.
template <class Op>
__global__ void convert_kernel(const typename Op::In* __restrict__ src,
                               typename Op::Out* __restrict__ dst, size_t n, size_t n4) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const Op op;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto* src4 = reinterpret_cast<const Vec4<In>*>(src);
  auto* dst4 = reinterpret_cast<Vec4<Out>*>(dst);
  for (size_t i = tid; i < n4; i += stride) {
    const Vec4<In> a = src4[i];
    Vec4<Out> b;
#pragma unroll
    for (int j = 0; j < 4; ++j) b.v[j] = op(a.v[j]);
    dst4[i] = b;
  }
  for (size_t i = 4 * n4 + tid; i < n; i += stride) dst[i] = op(src[i]);
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <class Op>
void launch(void* dst, const void* src, size_t n, cudaStream_t stream, const char* what) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const bool vec = aligned(src, sizeof(Vec4<In>)) && aligned(dst, sizeof(Vec4<Out>));
  const size_t n4 = vec ? n / 4 : 0;
  const int threads = 256;
  const size_t work = std::max<size_t>(n4, n - 4 * n4);  // threads either loop needs
  // Enough blocks to fill any current GPU several times over; the loop covers the rest.
  const size_t blocks = std::min<size_t>((work + threads - 1) / threads, 8192);
  cudak::launch(convert_kernel<Op>, static_cast<unsigned>(blocks), threads, 0, stream,
                static_cast<const In*>(src), static_cast<Out*>(dst), n, n4);
  ST_CUDA_CHECK_LAUNCH(what);
}

}  // namespace

bool cuda_can_convert(DType dst_dtype, DType src_dtype) {
  const auto half = [](DType t) { return t == DType::BF16 || t == DType::F16; };
  return (src_dtype == DType::F32 && half(dst_dtype)) ||
         (half(src_dtype) && dst_dtype == DType::F32);
}

void cuda_convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                  cudaStream_t stream) {
  if (n == 0) return;
  ST_CHECK(dst && src, "null device pointer converting ", dtype_name(src_dtype), " -> ",
           dtype_name(dst_dtype));
  if (src_dtype == DType::F32 && dst_dtype == DType::BF16) {
    launch<F32ToBF16>(dst, src, n, stream, "convert_kernel<fp32->bf16>");
  } else if (src_dtype == DType::BF16 && dst_dtype == DType::F32) {
    launch<BF16ToF32>(dst, src, n, stream, "convert_kernel<bf16->fp32>");
  } else if (src_dtype == DType::F32 && dst_dtype == DType::F16) {
    launch<F32ToF16>(dst, src, n, stream, "convert_kernel<fp32->fp16>");
  } else if (src_dtype == DType::F16 && dst_dtype == DType::F32) {
    launch<F16ToF32>(dst, src, n, stream, "convert_kernel<fp16->fp32>");
  } else {
    fail("CUDA backend: no device conversion from ", dtype_name(src_dtype), " to ",
         dtype_name(dst_dtype), " (supported: fp32 <-> bf16, fp32 <-> fp16)");
  }
}

}  // namespace st
