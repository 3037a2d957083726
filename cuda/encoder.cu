// Token + position embedding (layers/encoder_cpu.cpp's arithmetic, bit for bit).
// Forward: out[b,t,:] = round(wte[tok] + wpe[t]): one FP32 add, one rounding.
// Backward, deterministic without atomics: the host (which holds the tokens) sorts the B*T
// positions by token, stably, exactly as the CPU does, and groups equal tokens. One block
// row per group and one thread per channel then sums that token's dout rows in FP32 in
// (b, t) order and adds the sum to dwte once: round(dwte + sum). Distinct groups write
// distinct rows, so no two threads touch one element. dwpe: one thread per (t, channel)
// sums over b in order, then round(dwpe + sum). These are the CPU's sums in the CPU's order,
// so the results are bit-identical to it.
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace st::cudak {
namespace {

template <class T, int V>
__global__ void encoder_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                       int T_, int C, size_t nvec) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < nvec;
       p += stride) {
    const size_t i = p * V;  // C % V == 0: a vector never crosses a row
    const size_t bt = i / C;
    const int c = static_cast<int>(i - bt * C);
    const int t = static_cast<int>(bt % T_);
    const Vec<T, V> e = load_vec<V>(wte + static_cast<size_t>(tokens[bt]) * C + c);
    const Vec<T, V> q = load_vec<V>(wpe + static_cast<size_t>(t) * C + c);
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(to_float(e.v[k]) + to_float(q.v[k]));
    store_vec<V>(out + i, o);
  }
}

template <class T>
__global__ void encoder_dwte_kernel(T* dwte, const T* dout, const int32_t* order,
                                    const int32_t* starts, const int32_t* rows, int C) {
  const int g = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int i0 = starts[g], i1 = starts[g + 1];
  float acc = 0.0f;
  for (int i = i0; i < i1; ++i) acc += to_float(dout[static_cast<size_t>(order[i]) * C + c]);
  T* w = dwte + static_cast<size_t>(rows[g]) * C + c;
  *w = from_float<T>(to_float(*w) + acc);
}

template <class T>
__global__ void encoder_dwpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
  const int t = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int b = 0; b < B; ++b) acc += to_float(dout[(static_cast<size_t>(b) * T_ + t) * C + c]);
  T* w = dwpe + static_cast<size_t>(t) * C + c;
  *w = from_float<T>(to_float(*w) + acc);
}

constexpr int kThreads = 256;
constexpr int kChannelThreads = 128;

}  // namespace

void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                     int T, int C, DType dtype, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * C;
  if (n == 0) return;
  dispatch_storage(dtype, "encoder_forward", [&](auto tag) {
    using T_ = typename decltype(tag)::type;
    constexpr int W = kWide<T_>;
    const bool wide = C % W == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    if (wide) {
      cudak::launch(encoder_forward_kernel<T_, W>, grid_for(n / W, kThreads), kThreads, 0, stream,
                    static_cast<T_*>(out), tokens, static_cast<const T_*>(wte),
                    static_cast<const T_*>(wpe), T, C, n / W);
    } else {
      cudak::launch(encoder_forward_kernel<T_, 1>, grid_for(n, kThreads), kThreads, 0, stream,
                    static_cast<T_*>(out), tokens, static_cast<const T_*>(wte),
                    static_cast<const T_*>(wpe), T, C, n);
    }
    ST_CUDA_CHECK_LAUNCH("encoder_forward_kernel");
  });
}

void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* order,
                      const int32_t* starts, const int32_t* rows, int groups, int B, int T, int C,
                      DType dtype, cudaStream_t stream) {
  if (C == 0 || B == 0 || T == 0) return;
  const unsigned ctiles = static_cast<unsigned>((C + kChannelThreads - 1) / kChannelThreads);
  ST_CHECK(ctiles <= 65535u, "encoder_backward: C = ", C, " is too wide");
  dispatch_storage(dtype, "encoder_backward", [&](auto tag) {
    using T_ = typename decltype(tag)::type;
    if (groups > 0) {
      cudak::launch(encoder_dwte_kernel<T_>, dim3(static_cast<unsigned>(groups), ctiles),
                    kChannelThreads, 0, stream, static_cast<T_*>(dwte),
                    static_cast<const T_*>(dout), order, starts, rows, C);
      ST_CUDA_CHECK_LAUNCH("encoder_dwte_kernel");
    }
    cudak::launch(encoder_dwpe_kernel<T_>, dim3(static_cast<unsigned>(T), ctiles), kChannelThreads,
                  0, stream, static_cast<T_*>(dwpe), static_cast<const T_*>(dout), B, T, C);
    ST_CUDA_CHECK_LAUNCH("encoder_dwpe_kernel");
  });
}

}  // namespace st::cudak
