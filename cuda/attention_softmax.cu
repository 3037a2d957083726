// The baseline attention's own kernels (cuda/attention_baseline.cu holds the class, which
// puts them between cuBLASLt GEMMs): the head permutes and the softmax row kernels, with
// their host launchers (cuda/attention_softmax.h). Rounding and order: see the top of
// attention_baseline.cu and attention_softmax.h.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/attention_softmax.h"
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/launch.cuh"

namespace st::cudak {
namespace {

constexpr int kRowThreads = 256;   // one block per score row
constexpr int kCopyThreads = 256;  // head permutes

// x rounded once to T (round-to-nearest-even from the exact double), as the CPU's
// round_fmt: FP32 directly; BF16/FP16 through round-to-odd at FP32 (truncate, then set the
// last bit if inexact), which cannot double-round since FP32 has >= 2 more bits.
template <class T>
__device__ __forceinline__ T round_once(double x) {
  if constexpr (std::is_same_v<T, float>) {
    return __double2float_rn(x);
  } else {
    float t = __double2float_rz(x);
    if (static_cast<double>(t) != x) t = __uint_as_float(__float_as_uint(t) | 1u);
    return from_float<T>(t);
  }
}

// e = fl32(exp(S - mx)) with the difference and the exponential in FP64 (the CPU's
// round_fmt(std::exp(S - mx), FP32)).
__device__ __forceinline__ float row_exp(float s, float mx) {
  return __double2float_rn(exp(static_cast<double>(s) - static_cast<double>(mx)));
}

// ---- head permutes (one thread per element, grid-stride, coalesced on the packed side)

// The packed (B, T, row_stride) tensor's columns [col0 + h*hs, col0 + (h+1)*hs) and the
// per-head (BH, T, ld) layout: split (MERGE false) copies the packed rows into the heads,
// merge (MERGE true) the heads back into the packed columns [col0, col0 + C).
template <class T, bool MERGE>
__global__ void permute_heads_kernel(T* dst, const T* src, int B, int Tn, int NH, int hs,
                                     int64_t ld, int64_t row_stride, int64_t col0) {
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t n = static_cast<int64_t>(B) * Tn * C;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t bt = i / C, c = i - bt * C;
    const int64_t h = c / hs, j = c - h * hs;
    const int64_t b = bt / Tn, t = bt - b * Tn;
    const int64_t packed = bt * row_stride + col0 + c, head = ((b * NH + h) * Tn + t) * ld + j;
    if (MERGE)
      dst[packed] = src[head];
    else
      dst[head] = src[packed];
  }
}

// ---- row kernels: one block per row of S / dP (BH * T rows of ld elements)

// Per-row statistics (device arrays of BH * T), all null when collection is off.

// In place: the row of S becomes the row of P. Reads of S all precede the barrier inside
// the last block reduction before the write pass; in the write pass each element is read
// and then written by the same thread, and columns s >= n are only written.
// CACHE (the row fits in shared memory, launch_softmax_forward): S is read from global
// memory once, kept in dynamic shared memory as FP32 and overwritten there by e_s, so one
// global read and one write per element and one FP64 exp instead of three reads and two
// exps. Every thread touches only its own strided elements s = threadIdx.x + k*blockDim.x,
// in the same order either way, so both variants give the same bits (tested).
template <class T, bool CACHE>
__global__ void __launch_bounds__(kRowThreads)
    softmax_forward_kernel(T* SP, float* lse, int Tn, int64_t ld, bool causal, SoftmaxRowStats st,
                           double tie_tol) {
  ST_SHARED(float, sm_f, [32]);
  ST_SHARED(double, sm_d, [32]);
  ST_SHARED(int, sm_i, [32]);
  ST_SHARED_DYNAMIC(float, row_cache, 4);  // CACHE: n floats
  const int64_t row = blockIdx.x;          // bh * T + t
  const int t = static_cast<int>(row % Tn);
  const int n = causal ? t + 1 : Tn;  // visible keys 0 .. n-1
  T* x = SP + row * ld;
  auto score = [&](int s) { return CACHE ? row_cache[s] : to_float(x[s]); };

  float mx = -INFINITY;
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const float v = to_float(x[s]);
    if (CACHE) row_cache[s] = v;
    mx = fmaxf(mx, v);
  }
  mx = block_max(mx, sm_f);

  const bool stats = st.entropy != nullptr;
  if (stats) {  // the CPU's row_stats, in FP64 from the stored scores
    const double m = mx;
    int tied = 0, tilde_ones = 0;
    double z = 0;
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
      const double v = score(s);
      const double e = exp(v - m);
      tied += v >= m - tie_tol;
      z += e;
      // p_tilde_one: the unnormalised exp(S - max) rounded once to P's format T, from the
      // FP64 value as the CPU (not from the FP32 e below, which could round twice).
      tilde_ones += to_float(round_once<T>(e)) == 1.0f;
    }
    tied = block_sum(tied, sm_i);
    tilde_ones = block_sum(tilde_ones, sm_i);
    z = block_sum(z, sm_d);
    double h = 0;
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
      const double p = exp(static_cast<double>(score(s)) - m) / z;
      if (p > 0) h -= p * log(p);
    }
    h = block_sum(h, sm_d);
    if (threadIdx.x == 0) {
      st.entropy[row] = h;
      st.max_logit[row] = mx;
      st.tied[row] = tied > 1 ? 1 : 0;
      st.p_tilde_one[row] = tilde_ones;
    }
  }

  float sum = 0.0f;  // the CPU's FP32 row sum, reassociated
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const float e = row_exp(score(s), mx);
    if (CACHE) row_cache[s] = e;  // S_s is not needed any more
    sum += e;
  }
  sum = block_sum(sum, sm_f);

  const double dsum = sum;
  int ones = 0;
  for (int s = threadIdx.x; s < Tn; s += blockDim.x) {
    T p = from_float<T>(0.0f);
    if (s < n) {
      const float e = CACHE ? row_cache[s] : row_exp(to_float(x[s]), mx);
      p = round_once<T>(static_cast<double>(e) / dsum);
      ones += to_float(p) == 1.0f;
    }
    x[s] = p;
  }
  if (threadIdx.x == 0) lse[row] = __double2float_rn(static_cast<double>(mx) + log(dsum));
  if (stats) {
    ones = block_sum(ones, sm_i);
    if (threadIdx.x == 0) st.p_one[row] = ones;
  }
}

// In place: the row of dP becomes the row of dS. The reads of the delta pass precede the
// barriers inside block_sum; then each element is read and written by the same thread.
// CACHE: dP and P are kept in dynamic shared memory (2 n elements of T) by the delta pass,
// so the write pass reads no global memory; same arithmetic, same bits.
template <class T, bool CACHE>
__global__ void __launch_bounds__(kRowThreads)
    softmax_backward_kernel(T* dPS, const T* P, int Tn, int64_t ld, bool causal) {
  ST_SHARED(float, sm_f, [32]);
  ST_SHARED_DYNAMIC(unsigned char, row_bytes, 16);  // CACHE: dP[n], then P[n]
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(row % Tn);
  const int n = causal ? t + 1 : Tn;
  T* g = dPS + row * ld;
  const T* p = P + row * ld;
  T* gc = reinterpret_cast<T*>(row_bytes);
  T* pc = gc + n;

  float acc = 0.0f;  // the CPU's FP32 FMA chain, reassociated
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const T gs = g[s], ps = p[s];
    if (CACHE) {
      gc[s] = gs;
      pc[s] = ps;
    }
    acc = fmaf(to_float(gs), to_float(ps), acc);
  }
  const double delta = block_sum(acc, sm_f);

  for (int s = threadIdx.x; s < Tn; s += blockDim.x) {
    T v = from_float<T>(0.0f);
    if (s < n) {
      const double dp = to_float(CACHE ? gc[s] : g[s]);
      v = round_once<T>(static_cast<double>(to_float(CACHE ? pc[s] : p[s])) * (dp - delta));
    }
    g[s] = v;
  }
}

// Shared memory a block may take without opting in (static + dynamic); rows whose cache does
// not fit beside the kernel's static shared memory use the uncached kernels. (Comparing the
// dynamic bytes alone with 48 KB launched T in 12161..12288 forward and, in FP32, 6129..6144
// backward with more than 48 KB in all: a launch failure, found by the SIMT emulator's limit
// check, tests/simt.) STABLETRAIN_ATTN_NO_ROW_CACHE=1 forces the uncached kernels.
constexpr size_t kRowCacheBytes = 48 * 1024;
// The kernels' static shared memory: sm_f, sm_d, sm_i (forward), sm_f (backward).
constexpr size_t kFwdStaticSmem = 32 * (sizeof(float) + sizeof(double) + sizeof(int));
constexpr size_t kBwdStaticSmem = 32 * sizeof(float);
bool row_cache_allowed() {  // read at every launch (cheap), so a test can switch it
  const char* e = std::getenv("STABLETRAIN_ATTN_NO_ROW_CACHE");
  return !(e && *e && std::string(e) != "0");
}

unsigned copy_grid(int64_t n) {
  return grid_for(static_cast<size_t>(n), kCopyThreads);
}

template <bool MERGE>
void permute_heads(void* dst, const void* src, int B, int Tn, int NH, int hs, int64_t ld,
                   int64_t row_stride, int64_t col0, DType dtype, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(B) * Tn * NH * hs;
  dispatch_storage(dtype, MERGE ? "attention merge_heads" : "attention split_heads",
                   [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(permute_heads_kernel<T, MERGE>, copy_grid(n), kCopyThreads, 0, stream,
           static_cast<T*>(dst), static_cast<const T*>(src), B, Tn, NH, hs, ld, row_stride, col0);
    ST_CUDA_CHECK_LAUNCH(MERGE ? "merge_heads_kernel" : "split_heads_kernel");
  });
}

}  // namespace

void attn_split_heads(void* dst, const void* src, int B, int Tn, int NH, int hs, int64_t ld,
                      int64_t row_stride, int64_t col0, DType dtype, cudaStream_t stream) {
  permute_heads<false>(dst, src, B, Tn, NH, hs, ld, row_stride, col0, dtype, stream);
}

void attn_merge_heads(void* dst, const void* src, int B, int Tn, int NH, int hs, int64_t ld,
                      int64_t row_stride, int64_t col0, DType dtype, cudaStream_t stream) {
  permute_heads<true>(dst, src, B, Tn, NH, hs, ld, row_stride, col0, dtype, stream);
}

void softmax_forward(void* SP, float* lse, int64_t rows, int Tn, int64_t ld, bool causal,
                     const SoftmaxRowStats& st, double tie_tol, DType dtype, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_storage(dtype, "attention softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t cache = static_cast<size_t>(Tn) * sizeof(float);
    if (row_cache_allowed() && cache + kFwdStaticSmem <= kRowCacheBytes) {
      launch(softmax_forward_kernel<T, true>, static_cast<unsigned>(rows), kRowThreads, cache,
             stream, static_cast<T*>(SP), lse, Tn, ld, causal, st, tie_tol);
    } else {
      launch(softmax_forward_kernel<T, false>, static_cast<unsigned>(rows), kRowThreads, 0, stream,
             static_cast<T*>(SP), lse, Tn, ld, causal, st, tie_tol);
    }
    ST_CUDA_CHECK_LAUNCH("softmax_forward_kernel");
  });
}

void softmax_backward(void* dPS, const void* P, int64_t rows, int Tn, int64_t ld, bool causal,
                      DType dtype, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_storage(dtype, "attention softmax backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t cache = 2 * static_cast<size_t>(Tn) * sizeof(T);
    if (row_cache_allowed() && cache + kBwdStaticSmem <= kRowCacheBytes) {
      launch(softmax_backward_kernel<T, true>, static_cast<unsigned>(rows), kRowThreads, cache,
             stream, static_cast<T*>(dPS), static_cast<const T*>(P), Tn, ld, causal);
    } else {
      launch(softmax_backward_kernel<T, false>, static_cast<unsigned>(rows), kRowThreads, 0, stream,
             static_cast<T*>(dPS), static_cast<const T*>(P), Tn, ld, causal);
    }
    ST_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
  });
}

}  // namespace st::cudak
