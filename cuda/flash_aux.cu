// Small kernels around the flash attention: the delta pass for the delta modes that read O
// (o, o_split, o_fp32) and the per-row statistics of collect_stats. Both are written to give
// the CPU lab's values bit for bit where the CPU's order can be followed: one thread (delta)
// or one lane (scores) runs exactly the CPU's sequential FP32 FMA chain.
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/flash_common.cuh"
#include "cuda/flash_launch.cuh"
#include "cuda/launch.cuh"

namespace st::flash {
namespace {

// delta[bh*T + t] = sum_j dO[t][j] * O[t][j], j = 0 .. hs-1 in order, s = fma(dO_j, O_j, s)
// in FP32: attention/head_cpu.cpp's dot() with mac = fp32, bit for bit.
template <class T, int MODE, bool ACC_LOW>
__global__ void delta_o_kernel(const T* dout, const T* out, const T* olo, const float* o32,
                               float* delta, int B, int T_, int NH, int hs) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(B) * NH * T_) return;
  const int t = static_cast<int>(idx % T_);
  const int bh = static_cast<int>(idx / T_), b = bh / NH, h = bh % NH;
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t off = (static_cast<int64_t>(b) * T_ + t) * C + static_cast<int64_t>(h) * hs;
  constexpr int V = 8;  // 16-byte loads of T; hs is a multiple of 8 and rows are aligned
  float s = 0.f;
  for (int j0 = 0; j0 < hs; j0 += V) {
    const auto d = cudak::load_vec<V>(dout + off + j0);
    const auto o = cudak::load_vec<V>(out + off + j0);
    cudak::Vec<T, V> lo{};
    if constexpr (MODE == 1) lo = cudak::load_vec<V>(olo + off + j0);
    float f[V];
    if constexpr (MODE == 2) {
      const auto a = cudak::load_vec<4>(o32 + off + j0);
      const auto b2 = cudak::load_vec<4>(o32 + off + j0 + 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) f[i] = a.v[i], f[4 + i] = b2.v[i];
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float ov;
      if constexpr (MODE == 0)
        ov = from_t<T>(o.v[i]);
      else if constexpr (MODE == 1)
        ov = __fadd_rn(from_t<T>(o.v[i]), from_t<T>(lo.v[i]));
      else
        ov = f[i];
      s = __fmaf_rn(from_t<T>(d.v[i]), ov, s);
    }
  }
  if constexpr (ACC_LOW) s = round_t<T>(s);
  delta[idx] = s;
}

template <class T>
void delta_o_typed(int mode, bool acc_low, const void* dout, const void* out, const void* olo,
                   const float* o32, float* delta, int B, int T_, int NH, int hs,
                   cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(B) * NH * T_;
  const int threads = 128;
  const unsigned blocks = static_cast<unsigned>((rows + threads - 1) / threads);
  const T* d = static_cast<const T*>(dout);
  const T* o = static_cast<const T*>(out);
  const T* lo = static_cast<const T*>(olo);
#define ST_DELTA_LAUNCH(M, L)                                                                     \
  cudak::launch(delta_o_kernel<T, M, L>, blocks, threads, 0, stream, d, o, lo, o32, delta, B, T_, \
                NH, hs)
  if (mode == 0)
    acc_low ? ST_DELTA_LAUNCH(0, true) : ST_DELTA_LAUNCH(0, false);
  else if (mode == 1)
    acc_low ? ST_DELTA_LAUNCH(1, true) : ST_DELTA_LAUNCH(1, false);
  else
    acc_low ? ST_DELTA_LAUNCH(2, true) : ST_DELTA_LAUNCH(2, false);
#undef ST_DELTA_LAUNCH
  ST_CUDA_CHECK_LAUNCH("flash delta_o_kernel");
}

// ---- per-row statistics: one warp per row (bh, t); lane l takes keys l, l + 32, ...
// S_s = round_scores(scale * q.k_s) with q.k a sequential FP32 FMA chain over the head dim
// (the CPU's row_dots), so S, the maximum, the ties and the tile test are the CPU's exactly;
// the entropy is formed in FP64 as log Z - (1/Z) sum_s e_s (S_s - mx), e_s = exp(S_s - mx),
// which equals the CPU's -sum p log p up to FP64 rounding.
template <class T, bool SCORES_LOW>
__device__ __forceinline__ float row_score(const float* q, const T* k, int hs, float scale) {
  float s = 0.f;
  for (int j0 = 0; j0 < hs; j0 += 8) {
    const auto kv = cudak::load_vec<8>(k + j0);
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __fmaf_rn(q[j0 + i], from_t<T>(kv.v[i]), s);
  }
  return SCORES_LOW ? mul_round<T>(s, scale) : __fmul_rn(s, scale);
}

template <class T, bool SCORES_LOW>
__global__ void row_stats_kernel(const T* qkv, RowStats* out, int B, int T_, int NH, int hs,
                                 bool causal, float scale, double tie_tol, int bc) {
  constexpr int kWarps = 4;
  ST_SHARED(float, qs, [kWarps][128]);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const bool active = row < static_cast<int64_t>(B) * NH * T_;
  const int t = active ? static_cast<int>(row % T_) : 0;
  const int bh = active ? static_cast<int>(row / T_) : 0, b = bh / NH, h = bh % NH;
  const int64_t C = static_cast<int64_t>(NH) * hs, C3 = 3 * C;
  const T* base = qkv + static_cast<int64_t>(b) * T_ * C3 + static_cast<int64_t>(h) * hs;
  for (int j = lane; j < hs; j += 32) qs[warp][j] = from_t<T>(base[t * C3 + j]);
  __syncwarp();
  if (!active) return;  // whole warps only
  const float* q = qs[warp];
  const T* kb = base + C;
  const int last = causal ? t : T_ - 1;

  float mx = -INFINITY;
  for (int s = lane; s <= last; s += 32)
    mx = fmaxf(mx, row_score<T, SCORES_LOW>(q, kb + s * C3, hs, scale));
  mx = cudak::warp_max(mx);
  const float thr = __double2float_ru(static_cast<double>(mx) - tie_tol);
  int tied = 0, first = INT_MAX;
  double Z = 0, Wsum = 0;
  for (int s = lane; s <= last; s += 32) {
    const float S = row_score<T, SCORES_LOW>(q, kb + s * C3, hs, scale);
    if (S >= thr) {
      ++tied;
      first = min(first, s);
    }
    const double d = static_cast<double>(S) - mx;
    const double e = exp(d);
    Z += e;
    Wsum += e * d;
  }
  tied = cudak::warp_sum(tied);
  Z = cudak::warp_sum(Z);
  Wsum = cudak::warp_sum(Wsum);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  int in_tile = 0;
  if (tied > 1) {  // the CPU's test: another tied key in the first tied key's tile
    const int t0 = first / bc * bc, t1 = min(t0 + bc, last + 1);
    for (int s = t0 + lane; s < t1; s += 32)
      in_tile += row_score<T, SCORES_LOW>(q, kb + s * C3, hs, scale) >= thr;
    in_tile = cudak::warp_sum(in_tile);
  }
  if (lane == 0) {
    RowStats r;
    r.max_logit = mx;
    r.flags = (tied > 1 ? 1 : 0) | (in_tile > 1 ? 2 : 0);
    r.entropy = log(Z) - Wsum / Z;
    out[row] = r;
  }
}

template <class T>
void row_stats_typed(const void* qkv, RowStats* out, int B, int T_, int NH, int hs, bool causal,
                     bool scores_low, float scale, double tie_tol, int bc, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(B) * NH * T_;
  const unsigned blocks = static_cast<unsigned>((rows + 3) / 4);
  const T* q = static_cast<const T*>(qkv);
  if (scores_low)
    cudak::launch(row_stats_kernel<T, true>, blocks, 128, 0, stream, q, out, B, T_, NH, hs, causal,
                  scale, tie_tol, bc);
  else
    cudak::launch(row_stats_kernel<T, false>, blocks, 128, 0, stream, q, out, B, T_, NH, hs, causal,
                  scale, tie_tol, bc);
  ST_CUDA_CHECK_LAUNCH("flash row_stats_kernel");
}

}  // namespace

void delta_o(DType dtype, int mode, bool acc_low, const void* dout, const void* out,
             const void* o_lo, const float* o32, float* delta, int B, int T, int NH, int hs,
             cudaStream_t s) {
  ST_CHECK(hs % 8 == 0 && hs <= 128, "flash delta: head size ", hs);
  if (dtype == DType::BF16)
    delta_o_typed<__nv_bfloat16>(mode, acc_low, dout, out, o_lo, o32, delta, B, T, NH, hs, s);
  else
    delta_o_typed<__half>(mode, acc_low, dout, out, o_lo, o32, delta, B, T, NH, hs, s);
}

void row_stats(DType dtype, const void* qkv, RowStats* out, int B, int T, int NH, int hs,
               bool causal, bool scores_low, float scale, double tie_tol, int block_k,
               cudaStream_t s) {
  ST_CHECK(hs % 8 == 0 && hs <= 128, "flash stats: head size ", hs);
  if (dtype == DType::BF16)
    row_stats_typed<__nv_bfloat16>(qkv, out, B, T, NH, hs, causal, scores_low, scale, tie_tol,
                                   block_k, s);
  else
    row_stats_typed<__half>(qkv, out, B, T, NH, hs, causal, scores_low, scale, tie_tol, block_k, s);
}

}  // namespace st::flash
