// Flash attention forward kernel (FlashAttention-2 structure) and its dispatcher; included
// by flash_fwd_bf16.cu and flash_fwd_f16.cu, one storage type each.
//
// Algorithm: the CPU lab's flash_forward (attention/head_cpu.cpp), every rounding point the
// same. Per query row, key tiles of BC columns, in order:
//   S_s   = scale * (q . k_s)             q.k: MMA, FP32 accumulation; then one FP32 multiply
//                                         (scores = low: rounded once to T, exactly)
//   r_m   = max_s S_s; m' = r_m, or the stabilized shift (STAB); m_new = max(m, m')
//   alpha = exp(m - m_new)                 (0 on a row's first tile, exactly 1 when m_new = m)
//   P~_s  = round_T(exp(S_s - m_new))      the probs format is the compute format T
//   l     = alpha * l + sum_s P~_s         (one FMA; the row sum in FP32)
//   O~    = alpha * O~ + P~ V              (FA2 order: O~ scaled, then the MMAs accumulate
//                                         the tile's P~V into it, all FP32)
// ACC_LOW (accum = the compute format, the paper's BF16 O~ accumulator): alpha and l are
// rounded to T, and per tile the P~V partial is formed in FP32 from zero, then
//   O~ = round_T(alpha * O~ + round_T(pv)),  l = round_T(alpha * l + rowsum)
// with alpha * O~ and alpha * l exact in FP32 (products of two T values) and the sum rounded
// once, correctly (add_round), exactly the CPU's formula. O~ lives in registers as packed T
// pairs (it is a T value), which also keeps the register count near the FP32 mode's.
// End of row: O = round_T(O~ / l) (correctly rounded, div_round); o32 = O~ / l in FP32;
// lse = m + log(l) (FP64, rounded once to FP32, as the CPU). Remaining differences from
// the CPU lab (which rounds the exact FP64 value at each point): the MMA's summation order
// and the FP32 row sum (a few FP32 ulps, which can move a rounded T value by one T ulp where
// it falls next to a rounding boundary), exp in FP32 (ex2.approx: ~2^-21 relative), and
// m - m_new, S - m_new rounded to FP32 before exp.
//
// Stabilized flash (STAB, Qiu & Yao): per tile and row, ties = #{s : S_s >= r_m - tie_tol}
// (the threshold r_m - tie_tol is formed in FP64 and rounded up to FP32, so the comparison
// of an FP32 score with it is exactly the CPU's FP64 comparison); if ties > 1 and r_m != 0:
// m' = round_accum(r_m + min(shift, cap)) in FP64, shift = (beta - 1) r_m (r_m > 0) or -r_m.
//
// The O~ amplifier (AMP, flash_fwd_amp_*.cu; attention.o_tilde_bits / o_tilde_gain /
// o_tilde_scope, docs/numerics.md finding 7): O~ in FP32 registers whatever accum says,
// each tile's P~V formed from zero in FP32, then merged per element in FP64 exactly as the
// CPU lab's flash_forward (merge_pv_amp below): O~ = r_ot(alpha O~ + r_ot(pv)) with r_ot
// o_tilde_bits fraction bits on the amplified updates and accum's format on the others, or
// with the gain O~ = u + gain (r - u). Scope tied amplifies only the updates of tiles whose
// maximum is tied (the stabilized test above, on the unshifted scores, for flash too).
// alpha, l and the rest as the mode without it. What remains different from the lab is what
// the plain kernels have (the MMA's summation order, the FP32 row sum, ex2); where those are
// exact (tests/flash_amp_cases.h: the emulator's test_simt_flash_amp.cpp and the GPU's
// GpuFlash.AmplifierMatchesTheLab) the outputs are the lab's bits.
//
// Work decomposition: grid (B*NH, ceil(T / BR)); a block of BR/16 warps owns BR query rows,
// each warp 16 of them (two per thread: rows g and g + 8 of the warp's 16, see
// flash_common.cuh for the fragment layout). Query tiles run heaviest first (the causal
// tile nearest the end of the sequence has the most key tiles). K and V tiles stream
// through two shared-memory stages with cp.async: tile j+1 is in flight while tile j is
// used, and V_j's wait comes after S_j's softmax. Q's fragments stay in registers.
// Masking: only tiles that cross T or (causal) the diagonal test each entry; masked scores
// are -inf, so P~ = 0, and a fully masked tile leaves m (alpha = 1), l and O~ unchanged.
// Padding rows (>= T) compute on zero rows and are never stored.
#pragma once
#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/flash_common.cuh"
#include "cuda/flash_launch.cuh"
#include "cuda/launch.cuh"

namespace st::flash {

// One key tile of the online softmax for the thread's two rows (row_a = g, row_b = g + 8 of
// its warp's 16; s in the m16n8 C-fragment layout, which is also wgmma's accumulator layout):
// scale (and round, scores = low), mask, the tile maximum (stabilized: the shifted maximum),
// alpha, P~ = round_T(exp(S - m_new)) in place of s, the P~ == 1 counts and l. Shared by the
// mma.sync kernel (below) and the sm_90 kernel (flash_fwd_sm90.cuh), so both round alike.
// AMP (the O~ amplifier kernels): upd[ri] says how the row's O~ update of this tile goes:
// 0 the row has no unmasked key in the tile (the CPU lab never visits such a tile: O~ stays
// as it is), 1 rounded into accum, 2 amplified (o_tilde_scope all, or the tile is tied: more
// than one score within tie_tol of its maximum, the same test as stabilized flash's).
template <class T, int NB, bool STAB, bool ACC_LOW, bool AMP = false>
__device__ __forceinline__ void softmax_tile(float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], int (&ptilde)[2],
                                             const FwdParams& p, int kv0, int row_a, int row_b,
                                             int c, bool need_mask, int (&upd)[2]) {
  using AccT = std::conditional_t<ACC_LOW, T, float>;
  scale_scores<T, NB>(s, p.scale, p.scores_low);
  if (need_mask) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = kv0 + nb * 8 + 2 * c + (e & 1);
        const int row = e < 2 ? row_a : row_b;
        if (col >= p.T || (p.causal && col > row)) s[nb][e] = -INFINITY;
      }
  }

  // ---- online softmax, per row ri (0: row g, 1: row g + 8)
  float base[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float rm = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) rm = fmaxf(rm, fmaxf(s[nb][2 * ri], s[nb][2 * ri + 1]));
    rm = quad_max(rm);
    float mp = rm;
    int ties = 0;
    if (STAB || (AMP && p.o_tilde_tied)) {  // uniform over the kernel
      // Every lane takes part in the shuffles; the condition is applied afterwards.
      const float thr = __double2float_ru(static_cast<double>(rm) - p.tie_tol);
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) ties += (s[nb][2 * ri] >= thr) + (s[nb][2 * ri + 1] >= thr);
      ties = quad_sum_int(ties);
    }
    if constexpr (AMP) upd[ri] = rm == -INFINITY ? 0 : (!p.o_tilde_tied || ties > 1) ? 2 : 1;
    if constexpr (STAB) {
      if (ties > 1 && rm != 0.f && rm > -INFINITY) {
        const double r = rm;
        const double shift = r > 0 ? (p.beta - 1.0) * r : -r;
        mp = round_double<AccT>(r + fmin(shift, p.cap));
      }
    }
    const float mnew = fmaxf(m[ri], mp);
    base[ri] = mnew == -INFINITY ? 0.f : mnew;
    float a;
    if (m[ri] == -INFINITY) {
      a = 0.f;
    } else if (mnew == m[ri]) {
      a = 1.f;
    } else {
      a = fexp(__fsub_rn(m[ri], mnew));
      if constexpr (ACC_LOW) a = round_t<T>(a);
    }
    alpha[ri] = a;
    m[ri] = mnew;
  }
  float rs[2] = {0.f, 0.f};
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pr = round_t<T>(fexp(__fsub_rn(s[nb][e], base[e >> 1])));
      s[nb][e] = pr;
      rs[e >> 1] = __fadd_rn(rs[e >> 1], pr);
    }
  if (p.p_tilde_one) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) ptilde[e >> 1] += s[nb][e] == 1.f;
  }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    rs[ri] = quad_sum(rs[ri]);
    if constexpr (ACC_LOW) {
      l[ri] = add_round<T>(__fmul_rn(alpha[ri], l[ri]), rs[ri]);
    } else {
      l[ri] = __fmaf_rn(alpha[ri], l[ri], rs[ri]);
    }
  }
}

template <class T, int NB, bool STAB, bool ACC_LOW>
__device__ __forceinline__ void softmax_tile(float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], int (&ptilde)[2],
                                             const FwdParams& p, int kv0, int row_a, int row_b,
                                             int c, bool need_mask) {
  int unused[2];
  softmax_tile<T, NB, STAB, ACC_LOW, false>(s, m, l, alpha, ptilde, p, kv0, row_a, row_b, c,
                                            need_mask, unused);
}

// O~ *= alpha per row (FP32 mode, FA2 order: before the tile's P~V accumulates into it).
template <int ON>
__device__ __forceinline__ void scale_acc(float (&acc)[ON][4], const float (&alpha)[2]) {
#pragma unroll
  for (int nb = 0; nb < ON; ++nb) {
    acc[nb][0] = __fmul_rn(acc[nb][0], alpha[0]);
    acc[nb][1] = __fmul_rn(acc[nb][1], alpha[0]);
    acc[nb][2] = __fmul_rn(acc[nb][2], alpha[1]);
    acc[nb][3] = __fmul_rn(acc[nb][3], alpha[1]);
  }
}
// ACC_LOW: O~ = round_T(alpha * O~ + round_T(pv)), pv the tile's P~V formed from zero.
template <class T, int ON>
__device__ __forceinline__ void merge_pv_low(uint32_t (&acl)[ON][2], const float (&alpha)[2],
                                             const float (&pv)[ON][4]) {
#pragma unroll
  for (int nb = 0; nb < ON; ++nb)
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const float2 o = unpack2<T>(acl[nb][ri]);
      const float n0 = add_round<T>(__fmul_rn(alpha[ri], o.x), round_t<T>(pv[nb][2 * ri]));
      const float n1 = add_round<T>(__fmul_rn(alpha[ri], o.y), round_t<T>(pv[nb][2 * ri + 1]));
      acl[nb][ri] = pack2<T>(n0, n1);
    }
}

// AMP: the O~ update as the CPU lab's flash_forward forms it, in FP64 from the FP32 values:
// u = alpha * O~ + pv (alpha * O~ exact in FP64: two values of at most 24 bits), pv the
// tile's P~V formed from zero,
//   r  = r_ot(alpha * O~ + r_ot(pv))   r_ot: o_tilde_bits fraction bits on an amplified
//                                      update (round_bits), else accum's format (T or FP32)
//   O~ = r, or with o_tilde_gain on an amplified update O~ = round_FP32(u + gain * (r - u))
// Each rounding is one correct rounding of the FP64 value, as round_fmt /
// round_fraction_bits on the CPU; the kernels are built without FMA contraction, so the FP64
// expressions are the CPU's operation for operation. Rows with upd 0 keep O~ as it is.
template <class T, int ON, bool ACC_LOW>
__device__ __forceinline__ void merge_pv_amp(float (&acc)[ON][4], const float (&alpha)[2],
                                             const float (&pv)[ON][4], const int (&upd)[2],
                                             const FwdParams& p) {
  const int bits = p.o_tilde_bits;
  const double gain = p.o_tilde_gain;
  auto r_ot = [bits](double x, bool amp) -> float {
    if (amp && bits) return round_bits(x, bits);
    if constexpr (ACC_LOW) return round_double<T>(x);
    return __double2float_rn(x);
  };
#pragma unroll
  for (int nb = 0; nb < ON; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int u_ = upd[e >> 1];
      if (u_ == 0) continue;
      const bool amp = u_ == 2;
      const double scaled = static_cast<double>(alpha[e >> 1]) * static_cast<double>(acc[nb][e]);
      const double x = pv[nb][e];
      const float r = r_ot(scaled + static_cast<double>(r_ot(x, amp)), amp);
      if (amp && gain != 0) {
        const double u = scaled + x;
        acc[nb][e] = __double2float_rn(u + gain * (static_cast<double>(r) - u));
      } else {
        acc[nb][e] = r;
      }
    }
}

// The end of the rows: O = round_T(O~ / l) (and o32 / o_lo), lse = m + log(l), the P~ == 1
// counts; acc (FP32 O~) or acl (ACC_LOW: packed T pairs) in the C-fragment layout.
template <class T, int HD, bool ACC_LOW>
__device__ __forceinline__ void store_rows(const FwdParams& p, const float (&acc)[HD / 8][4],
                                           const uint32_t (&acl)[HD / 8][2], const float (&m)[2],
                                           const float (&l)[2], int (&ptilde)[2], int row_a,
                                           int row_b, int bh, int c) {
  constexpr int ON = HD / 8;
  const int T_ = p.T, b = bh / p.NH, h = bh % p.NH;
  const int64_t C = static_cast<int64_t>(p.NH) * HD;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) ptilde[ri] = quad_sum_int(ptilde[ri]);
  T* gout = static_cast<T*>(p.out) + static_cast<int64_t>(b) * T_ * C + h * HD;
  T* glo = p.o_lo ? static_cast<T*>(p.o_lo) + static_cast<int64_t>(b) * T_ * C + h * HD : nullptr;
  float* g32 = p.o32 ? p.o32 + static_cast<int64_t>(b) * T_ * C + h * HD : nullptr;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int row = ri ? row_b : row_a;
    if (row >= T_) continue;
    const float L = l[ri];
    const int64_t off = static_cast<int64_t>(row) * C + 2 * c;
#pragma unroll
    for (int nb = 0; nb < ON; ++nb) {
      float v0, v1;
      if constexpr (ACC_LOW) {
        const float2 o = unpack2<T>(acl[nb][ri]);
        v0 = o.x;
        v1 = o.y;
      } else {
        v0 = acc[nb][2 * ri];
        v1 = acc[nb][2 * ri + 1];
      }
      const float h0 = div_round<T>(v0, L), h1 = div_round<T>(v1, L);  // the stored O
      *reinterpret_cast<uint32_t*>(gout + off + nb * 8) = pack2<T>(h0, h1);
      if (g32 || glo) {
        const float f0 = __fdiv_rn(v0, L), f1 = __fdiv_rn(v1, L);
        if (g32) *reinterpret_cast<float2*>(g32 + off + nb * 8) = make_float2(f0, f1);
        if (glo) {
          // The residual of the stored O against the FP32 O: f - h is exact in FP32 (h is
          // f's value rounded to T, within a factor 2 of f: Sterbenz), then rounded once.
          *reinterpret_cast<uint32_t*>(glo + off + nb * 8) =
              pack2<T>(__fsub_rn(f0, h0), __fsub_rn(f1, h1));
        }
      }
    }
    if (c == 0) {
      const int64_t r = static_cast<int64_t>(bh) * T_ + row;
      // m + log(l) in FP64, rounded once to FP32 (as the CPU; one FP64 log per row).
      p.lse[r] = __double2float_rn(static_cast<double>(m[ri]) + log(static_cast<double>(L)));
      if (p.p_tilde_one) p.p_tilde_one[r] = ptilde[ri];
    }
  }
}

template <class T, int HD, int BR, int BC, bool STAB, bool ACC_LOW, bool AMP>
__global__ void __launch_bounds__(BR * 2) fwd_kernel(const FwdParams p) {
  constexpr int NT = BR * 2;  // BR / 16 warps
  constexpr int P = kPitch<HD>;
  constexpr int NB = BC / 8;  // S n-blocks per warp
  constexpr int ON = HD / 8;  // O n-blocks per warp
  ST_SHARED_DYNAMIC(unsigned char, smem, 128);
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sK = sQ + BR * P * 2;      // 2 stages of BC rows
  const uint32_t sV = sK + 2 * BC * P * 2;  // 2 stages of BC rows
  constexpr uint32_t kStage = BC * P * 2;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int T_ = p.T, NH = p.NH;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;
  const int64_t C = static_cast<int64_t>(NH) * HD, C3 = 3 * C;
  const T* gq = static_cast<const T*>(p.qkv) + static_cast<int64_t>(b) * T_ * C3 + h * HD;
  const T* gk = gq + C;
  const T* gv = gq + 2 * C;
  const int kv_end = p.causal ? min(T_, q0 + BR) : T_;
  const int n_kv = (kv_end + BC - 1) / BC;

  // Groups, in commit order: Q, K_0, V_0, then K_{j+1}, V_{j+1} in iteration j (empty past
  // the end), so "all but the newest 3" is K_j (and Q) and "all but 2" is V_j.
  load_tile<BR, HD, NT>(sQ, gq, C3, q0, T_, tid);
  cp_async_commit();
  load_tile<BC, HD, NT>(sK, gk, C3, 0, kv_end, tid);
  cp_async_commit();
  load_tile<BC, HD, NT>(sV, gv, C3, 0, kv_end, tid);
  cp_async_commit();

  const int row_a = q0 + warp * 16 + g, row_b = row_a + 8;  // this thread's two rows
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float acc[ON][4];     // O~ (FP32 mode; AMP: every mode, the values of O~'s format)
  uint32_t acl[ON][2];  // O~ as packed T pairs (ACC_LOW): [nb][ri] = (d[2ri], d[2ri+1])
#pragma unroll
  for (int nb = 0; nb < ON; ++nb) {
    acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
    acl[nb][0] = acl[nb][1] = 0u;  // +0 in bf16 and f16
  }
  int ptilde[2] = {0, 0};  // P~ == 1 per row (p_tilde_one)
  uint32_t qf[HD / 16][4];

  for (int j = 0; j < n_kv; ++j) {
    const int st = j & 1;
    if (j + 1 < n_kv) {
      load_tile<BC, HD, NT>(sK + (st ^ 1) * kStage, gk, C3, (j + 1) * BC, kv_end, tid);
      cp_async_commit();
      load_tile<BC, HD, NT>(sV + (st ^ 1) * kStage, gv, C3, (j + 1) * BC, kv_end, tid);
      cp_async_commit();
    } else {
      cp_async_commit();
      cp_async_commit();
    }
    cp_async_wait<3>();  // Q and K_j have landed (this thread's copies) ...
    __syncthreads();     // ... and everyone's
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < HD / 16; ++ks) lds_a<P>(qf[ks], sQ, warp * 16, ks * 16, lane);
    }

    // ---- S = scale * Q K_j^T (16 x BC per warp), masked
    float s[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
    gemm_abt_reg<T, HD, NB>(s, qf, sK + st * kStage, 0, lane);
    const int kv0 = j * BC;
    const bool need_mask = kv0 + BC > T_ || (p.causal && kv0 + BC - 1 > q0);
    float alpha[2];
    int upd[2];  // AMP: how each row's O~ update goes (softmax_tile)
    softmax_tile<T, NB, STAB, ACC_LOW, AMP>(s, m, l, alpha, ptilde, p, kv0, row_a, row_b, c,
                                            need_mask, upd);
    uint32_t pa[BC / 16][4];
    c_to_a<T, NB>(pa, s);

    // ---- O~ update with V_j
    cp_async_wait<2>();
    __syncthreads();
    if constexpr (AMP) {
      float pv[ON][4];
#pragma unroll
      for (int nb = 0; nb < ON; ++nb) pv[nb][0] = pv[nb][1] = pv[nb][2] = pv[nb][3] = 0.f;
      gemm_pv<T, HD, BC>(pv, pa, sV + st * kStage, 0, lane);
      merge_pv_amp<T, ON, ACC_LOW>(acc, alpha, pv, upd, p);
    } else if constexpr (!ACC_LOW) {
      scale_acc<ON>(acc, alpha);
      gemm_pv<T, HD, BC>(acc, pa, sV + st * kStage, 0, lane);
    } else {
      float pv[ON][4];
#pragma unroll
      for (int nb = 0; nb < ON; ++nb) pv[nb][0] = pv[nb][1] = pv[nb][2] = pv[nb][3] = 0.f;
      gemm_pv<T, HD, BC>(pv, pa, sV + st * kStage, 0, lane);
      merge_pv_low<T, ON>(acl, alpha, pv);
    }
    __syncthreads();  // stage st is refilled in the next iteration
  }

  store_rows<T, HD, ACC_LOW && !AMP>(p, acc, acl, m, l, ptilde, row_a, row_b, bh, c);
}

template <class T, int HD, int BR, int BC, bool STAB, bool ACC_LOW, bool AMP>
void launch_fwd(const FwdParams& p, cudaStream_t stream) {
  constexpr int kSmem = (BR + 4 * BC) * kPitch<HD> * 2;
  auto kernel = fwd_kernel<T, HD, BR, BC, STAB, ACC_LOW, AMP>;
  // Per call (cheap), so it holds on whichever device is current.
  ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(static_cast<unsigned>(p.B * p.NH), static_cast<unsigned>((p.T + BR - 1) / BR));
  cudak::launch(kernel, grid, BR * 2, kSmem, stream, p);
  ST_CUDA_CHECK_LAUNCH("flash fwd_kernel");
}

template <class T, int HD, int BR, int BC, bool AMP>
void fwd_variants(const FwdParams& p, bool stab, bool acc_low, cudaStream_t s) {
  if (stab) {
    if (acc_low)
      launch_fwd<T, HD, BR, BC, true, true, AMP>(p, s);
    else
      launch_fwd<T, HD, BR, BC, true, false, AMP>(p, s);
  } else {
    if (acc_low)
      launch_fwd<T, HD, BR, BC, false, true, AMP>(p, s);
    else
      launch_fwd<T, HD, BR, BC, false, false, AMP>(p, s);
  }
}

template <class T, int HD, bool AMP>
void fwd_tiles(const FwdParams& p, int bq, int bk, bool stab, bool acc_low, cudaStream_t s) {
  if (bq == 64 && bk == 64) return fwd_variants<T, HD, 64, 64, AMP>(p, stab, acc_low, s);
  if (bq == 128 && bk == 64) return fwd_variants<T, HD, 128, 64, AMP>(p, stab, acc_low, s);
  if (bq == 128 && bk == 128) return fwd_variants<T, HD, 128, 128, AMP>(p, stab, acc_low, s);
  fail("flash attention (CUDA): tiles attention.block_q = ", bq, ", attention.block_k = ", bk,
       " are not supported (supported (block_q, block_k): ", kFwdTilesText, ")");
}

// AMP: the amplifier kernels (flash_fwd_amp_*.cu), which need o_tilde_bits or o_tilde_gain;
// the others (flash_fwd_bf16.cu, flash_fwd_f16.cu) refuse both.
template <class T, bool AMP>
void fwd_dispatch(const FwdParams& p, int bq, int bk, bool stab, bool acc_low, cudaStream_t s) {
  ST_CHECK(p.B * p.NH > 0 && p.T > 0, "flash forward: empty problem");
  ST_CHECK((p.T + 63) / 64 <= 65535, "flash forward: T = ", p.T, " is too long");
  const bool amp = p.o_tilde_bits != 0 || p.o_tilde_gain != 0;
  ST_CHECK(amp == AMP, "flash forward: ", AMP ? "the amplifier kernels need" : "the plain kernels "
           "do not take", " attention.o_tilde_bits or o_tilde_gain (bits ", p.o_tilde_bits,
           ", gain ", p.o_tilde_gain, ")");
  ST_CHECK(!p.o_tilde_bits || (p.o_tilde_bits >= 1 && p.o_tilde_bits <= 21),
           "flash forward: o_tilde_bits = ", p.o_tilde_bits, " (1..21)");
  if (p.hs == 64) return fwd_tiles<T, 64, AMP>(p, bq, bk, stab, acc_low, s);
  if (p.hs == 128) return fwd_tiles<T, 128, AMP>(p, bq, bk, stab, acc_low, s);
  fail("flash attention (CUDA): head size ", p.hs, " is not supported (64 or 128)");
}

}  // namespace st::flash
