// Device-side helpers shared by the CUDA kernels (included by .cu files only).
//  - Storage types: float (FP32), __nv_bfloat16 (BF16), __half (FP16). Values are widened
//    exactly to float for arithmetic and rounded once when stored (from_float: RNE, the
//    same as core/dtype.h bit for bit).
//  - Vec<T, V>: V consecutive elements in one aligned load/store (V = 16 / sizeof(T) for
//    128-bit accesses, or 1 for the scalar path used when a pointer or a row length does not
//    allow the wide one).
//  - block_sum / block_max: deterministic block reductions. Each warp reduces with an XOR
//    butterfly (every lane ends with the same value, since a + b == b + a exactly), then the
//    per-warp values are reduced the same way by every warp. The order of additions depends
//    only on blockDim, never on timing, so the result is bit-identical from run to run.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace st::cudak {

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <class T>
constexpr int kWide = static_cast<int>(16 / sizeof(T));  // elements in a 128-bit access

template <int V, class T>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}
template <int V, class T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// blockDim.x must be a multiple of 32 (at most 1024); every thread of the block must call.
// `smem` holds 32 values; the leading barrier lets a block call these back to back.
template <class A>
__device__ __forceinline__ A block_sum(A v, A* smem) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : A(0);
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* smem) {
  v = warp_max(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : -INFINITY;
  return warp_max(v);
}

// Column c's sum of part[k * C + c] over k = 0 .. chunks-1, added in k order from 0 (the
// second pass of the chunked column sums). The loads of kBatch chunks are issued before their
// adds: a plain loop keeps the few loads in flight that nvcc unrolls (4), so a thousand
// chunks cost hundreds of dependent L2 round trips; batching cuts them kBatch-fold. Same sum.
template <int kBatch = 32>
__device__ __forceinline__ float chunk_sum(const float* part, int chunks, int C, int c) {
  float acc = 0.0f;
  for (int k0 = 0; k0 < chunks; k0 += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (k0 + u < chunks) v[u] = part[static_cast<size_t>(k0 + u) * C + c];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (k0 + u < chunks) acc += v[u];
  }
  return acc;
}

// ---- host side ----

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the element type of storage dtype `t` (F32, BF16, F16).
template <class F>
void dispatch_storage(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::F32:
      f(TypeTag<float>{});
      return;
    case DType::BF16:
      f(TypeTag<__nv_bfloat16>{});
      return;
    case DType::F16:
      f(TypeTag<__half>{});
      return;
    default:
      fail("CUDA ", what, ": unsupported storage dtype ", dtype_name(t),
           " (expected fp32, bf16 or fp16)");
  }
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Grid for a grid-stride loop over `work` items with `threads` per block: enough blocks to
// fill any current GPU several times over, the loop covers the rest.
inline unsigned grid_for(size_t work, int threads, size_t max_blocks = 8192) {
  size_t b = (work + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

}  // namespace st::cudak
