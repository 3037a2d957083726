// Flash attention backward kernels and their dispatcher; included by flash_bwd_bf16.cu and
// flash_bwd_f16.cu, one storage type each.
//
// DETERMINISTIC: no floating-point atomics. FlashAttention-2 computes dQ inside the dK/dV
// kernel and adds each key tile's contribution to dQ with atomicAdd (order-dependent
// rounding); here dQ has its own kernel (one block per query tile looping over key tiles)
// that recomputes S, P, dP and dS. That costs one more pass of Q K^T and dO V^T: the
// backward does 2 + 2 + 1 + 1 + 1 = 7 tile GEMMs instead of FA2's 5 (about 1.4x the FLOPs),
// in exchange for bit-identical gradients from run to run.
//
// Algorithm, the CPU lab's head_backward (attention/head_cpu.cpp):
//   P  = round_T(exp(scale * q.k - lse))       recomputed, masked entries 0
//   dP = dO . v (FP32 MMA; rounded to T when accum is the low format)
//   dS = round_T(P * fl32(dP - delta))         delta from the delta pass (flash_aux.cu, or
//                                              delta_kernel below for dp_p); the product is
//                                              rounded once (mul_round), the difference to
//                                              FP32 first (the CPU: one rounding of the exact
//                                              P * (dP - delta); they differ by at most one T
//                                              ulp, and only where dP - delta is inexact)
//   dV = sum P^T dO, dK = scale * sum dS^T Q, dQ = scale * sum dS K, FP32 accumulators,
//   each rounded once to T at the end (dK and dQ correctly rounded after the scale).
// ACC_LOW (accum = the compute format): the CPU adds each tile's FP32 partial sum to an
// accumulator rounded to T: dK, dV per query tile of block_q rows, dQ per key tile of
// block_k keys. Here the rounded accumulator lives in the output tensor itself (it is a T
// value): at each block_q (block_k) boundary a thread reads its own elements, adds its FP32
// partial (add_round: one correct rounding) and writes them back, then restarts the partial
// from zero. Same tiles, same rounding points; only the partial sums' order differs (MMA).
//
// dK/dV kernel: grid (B*NH, ceil(T / BCK)); BCK/16 warps, each owning 16 keys and computing
// the transposed products, so every warp's work is independent (no cross-warp reduction):
//   S^T = K Q^T (A = the warp's K rows, B = Q rows),  P^T from it (lse per column = query)
//   dV += P^T dO (P^T stays in registers as A fragments; B = dO with .trans)
//   dP^T = V dO^T, dS^T = P^T * (dP^T - delta), dK += dS^T Q (B = Q with .trans)
// K and V tiles (BCK rows) stay in shared memory; Q, dO, lse and delta tiles of BRI query
// rows stream through two stages with cp.async. Causal: query tiles start at the block's
// first key (earlier queries see none of its keys).
//
// dQ kernel: grid (B*NH, ceil(T / BRQ)), heaviest (last) query tile first; BRQ/16 warps of 16
// query rows. Q and dO tiles stay in shared memory; K, V tiles of BCI keys stream through
// two stages. S = Q K^T, P, dP = dO V^T, dS, dQ += dS K (B = K with .trans). The same kernel
// with DELTA = true is the dp_p delta pass: delta = rowsum(dP * P) over the whole row (FP32,
// the quad's partial sums added in a fixed order), no dQ.
#pragma once
#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/flash_common.cuh"
#include "cuda/flash_launch.cuh"
#include "cuda/launch.cuh"

namespace st::flash {

// Backward tiles: dK/dV blocks of kBck keys (8 warps) over query tiles of bri(HD) rows; dQ
// blocks of kBrq queries (8 warps) over key tiles of kBci keys.
constexpr int kBck = 128;
constexpr int kBrq = 128;
constexpr int kBci = 64;
template <int HD>
constexpr int kBri = HD <= 64 ? 64 : 32;  // bounds the dK/dV kernel's registers at HD = 128

// ---- The dK/dV kernel's per-tile steps, shared with the sm_90 dK/dV kernel
// (flash_bwd_sm90.cuh). Fragments: S^T, dP^T in the m16n8 C layout, rows = the thread's keys
// key_a = g, key_b = g + 8 of its warp's 16, columns = queries q0 + nb * 8 + 2c (+1);
// lse(qi) and del(qi) give the query tile's row qi's lse and delta (0 past T).

// P^T = round_T(exp(scale S^T - lse)) in place of S^T; masked entries 0.
template <class T, int NBQ, class Lse>
__device__ __forceinline__ void dkdv_tile_p(float (&s)[NBQ][4], const BwdParams& p, Lse lse,
                                            int q0, int key_a, int key_b, int c, bool need_mask) {
  scale_scores<T, NBQ>(s, p.scale, p.scores_low);
#pragma unroll
  for (int nb = 0; nb < NBQ; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[nb][e] = round_t<T>(fexp(__fsub_rn(s[nb][e], lse(nb * 8 + 2 * c + (e & 1)))));
  if (need_mask) {
#pragma unroll
    for (int nb = 0; nb < NBQ; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q = q0 + nb * 8 + 2 * c + (e & 1), key = e < 2 ? key_a : key_b;
        if (q >= p.T || key >= p.T || (p.causal && key > q)) s[nb][e] = 0.f;
      }
  }
}
// dS^T = round_T(P^T * fl32(dP^T - delta)) in place of dP^T (P^T: pa, A fragments).
template <class T, int NBQ, bool ACC_LOW, class Del>
__device__ __forceinline__ void dkdv_tile_ds(float (&s)[NBQ][4], const uint32_t (&pa)[NBQ / 2][4],
                                             Del del, int c) {
#pragma unroll
  for (int nb = 0; nb < NBQ; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float dp = s[nb][e];
      if constexpr (ACC_LOW) dp = round_t<T>(dp);
      s[nb][e] = mul_round<T>(a_elem<T, NBQ>(pa, nb, e), __fsub_rn(dp, del(nb * 8 + 2 * c + (e & 1))));
    }
}
// ACC_LOW: an FP32 partial (the thread's rows row_a, row_b of a (T, 3C) slice at g) added to
// the T accumulator the output holds (0 before the first flush), one correct rounding per
// element. The dK/dV and dQ kernels' flushes.
template <class T, int ON>
__device__ __forceinline__ void add_partial(const float (&acc)[ON][4], bool flushed, T* g,
                                            int row_a, int row_b, int T_, int64_t C3, int c) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int row = ri ? row_b : row_a;
    if (row >= T_) continue;
    const int64_t off = static_cast<int64_t>(row) * C3 + 2 * c;
#pragma unroll
    for (int nb = 0; nb < ON; ++nb) {
      uint32_t* pg = reinterpret_cast<uint32_t*>(g + off + nb * 8);
      const float2 o = flushed ? unpack2<T>(*pg) : make_float2(0.f, 0.f);
      *pg = pack2<T>(add_round<T>(o.x, acc[nb][2 * ri]), add_round<T>(o.y, acc[nb][2 * ri + 1]));
    }
  }
}
template <int ON>
__device__ __forceinline__ void zero_acc(float (&acc)[ON][4]) {
#pragma unroll
  for (int nb = 0; nb < ON; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
}
// ACC_LOW: dK and dV flushed into dqkv and restarted from zero.
template <class T, int ON>
__device__ __forceinline__ void dkdv_flush(float (&dk)[ON][4], float (&dv)[ON][4], bool& flushed,
                                           T* gdk, T* gdv, int key_a, int key_b, int T_,
                                           int64_t C3, int c) {
  add_partial<T, ON>(dk, flushed, gdk, key_a, key_b, T_, C3, c);
  add_partial<T, ON>(dv, flushed, gdv, key_a, key_b, T_, C3, c);
  flushed = true;
  zero_acc<ON>(dk);
  zero_acc<ON>(dv);
}
// The end: dK = round_T(scale dK), dV = round_T(dV) (ACC_LOW: dK from its T accumulator; dV
// is final already).
template <class T, int ON, bool ACC_LOW>
__device__ __forceinline__ void dkdv_store(const BwdParams& p, const float (&dk)[ON][4],
                                           const float (&dv)[ON][4], T* gdk, T* gdv, int key_a,
                                           int key_b, int64_t C3, int c) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int key = ri ? key_b : key_a;
    if (key >= p.T) continue;
    const int64_t off = static_cast<int64_t>(key) * C3 + 2 * c;
#pragma unroll
    for (int nb = 0; nb < ON; ++nb) {
      uint32_t* pk = reinterpret_cast<uint32_t*>(gdk + off + nb * 8);
      if constexpr (ACC_LOW) {
        const float2 a = unpack2<T>(*pk);
        *pk = pack2<T>(mul_round<T>(a.x, p.scale), mul_round<T>(a.y, p.scale));
      } else {
        *pk = pack2<T>(mul_round<T>(dk[nb][2 * ri], p.scale),
                       mul_round<T>(dk[nb][2 * ri + 1], p.scale));
        *reinterpret_cast<uint32_t*>(gdv + off + nb * 8) =
            pack2<T>(dv[nb][2 * ri], dv[nb][2 * ri + 1]);
      }
    }
  }
}

template <class T, int HD, int BCK, int BRI, bool ACC_LOW>
__global__ void __launch_bounds__(BCK * 2) dkdv_kernel(const BwdParams p) {
  constexpr int NT = BCK * 2;
  constexpr int P = kPitch<HD>;
  constexpr int NBQ = BRI / 8;  // S^T n-blocks (queries) per warp
  constexpr int ON = HD / 8;
  constexpr uint32_t kStage = BRI * P * 2;
  ST_SHARED_DYNAMIC(unsigned char, smem, 128);
  const uint32_t sK = smem_addr(smem);
  const uint32_t sV = sK + BCK * P * 2;
  const uint32_t sQ = sV + BCK * P * 2;                                          // 2 stages
  const uint32_t sdO = sQ + 2 * kStage;                                          // 2 stages
  float* sL = reinterpret_cast<float*>(smem + (2 * BCK * P + 4 * BRI * P) * 2);  // [2][BRI]
  float* sD = sL + 2 * BRI;                                                      // [2][BRI]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int T_ = p.T, NH = p.NH;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.y * BCK;
  const int64_t C = static_cast<int64_t>(NH) * HD, C3 = 3 * C;
  const T* gq = static_cast<const T*>(p.qkv) + static_cast<int64_t>(b) * T_ * C3 + h * HD;
  const T* gk = gq + C;
  const T* gv = gq + 2 * C;
  const T* gdo = static_cast<const T*>(p.dout) + static_cast<int64_t>(b) * T_ * C + h * HD;
  const float* glse = p.lse + static_cast<int64_t>(bh) * T_;
  const float* gdel = p.delta + static_cast<int64_t>(bh) * T_;
  const int it0 = p.causal ? k0 / BRI : 0;
  const int n_it = (T_ + BRI - 1) / BRI;

  auto load_q_tile = [&](int it, int stage) {
    const int q0 = it * BRI;
    load_tile<BRI, HD, NT>(sQ + stage * kStage, gq, C3, q0, T_, tid);
    load_tile<BRI, HD, NT>(sdO + stage * kStage, gdo, C, q0, T_, tid);
    if (tid < 2 * BRI) {  // lse and delta of the tile's rows; rows >= T read as 0
      const int r = tid % BRI, row = q0 + r;
      const bool ok = row < T_;
      float* dst = (tid < BRI ? sL : sD) + stage * BRI + r;
      ptx::cp_async_4(smem_addr(dst), (tid < BRI ? glse : gdel) + (ok ? row : 0), ok);
    }
  };
  load_tile<BCK, HD, NT>(sK, gk, C3, k0, T_, tid);
  load_tile<BCK, HD, NT>(sV, gv, C3, k0, T_, tid);
  cp_async_commit();
  load_q_tile(it0, 0);
  cp_async_commit();

  const int key_a = k0 + warp * 16 + g, key_b = key_a + 8;  // this thread's two keys
  float dk[ON][4], dv[ON][4];
#pragma unroll
  for (int nb = 0; nb < ON; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nb][e] = dv[nb][e] = 0.f;
  bool flushed = false;  // ACC_LOW: the output holds a rounded accumulator

  T* gdk = static_cast<T*>(p.dqkv) + static_cast<int64_t>(b) * T_ * C3 + C + h * HD;
  T* gdv = gdk + C;

  for (int it = it0; it < n_it; ++it) {
    const int st = (it - it0) & 1;
    if (it + 1 < n_it) load_q_tile(it + 1, st ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int q0 = it * BRI;
    const uint32_t sQs = sQ + st * kStage, sdOs = sdO + st * kStage;
    const float* lse_s = sL + st * BRI;
    const float* del_s = sD + st * BRI;
    const bool need_mask = q0 + BRI > T_ || k0 + BCK > T_ || (p.causal && k0 + BCK - 1 > q0);

    // ---- S^T = K Q^T, P^T (16 keys x BRI queries per warp)
    float s[NBQ][4];
#pragma unroll
    for (int nb = 0; nb < NBQ; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
    gemm_abt<T, HD, NBQ>(s, sK, warp * 16, sQs, 0, lane);
    dkdv_tile_p<T, NBQ>(s, p, [&](int qi) { return lse_s[qi]; }, q0, key_a, key_b, c, need_mask);
    uint32_t pa[BRI / 16][4];
    c_to_a<T, NBQ>(pa, s);
    // ---- dV += P^T dO
    gemm_pv<T, HD, BRI>(dv, pa, sdOs, 0, lane);
    // ---- dP^T = V dO^T; dS^T = P^T (dP^T - delta)
#pragma unroll
    for (int nb = 0; nb < NBQ; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
    gemm_abt<T, HD, NBQ>(s, sV, warp * 16, sdOs, 0, lane);
    dkdv_tile_ds<T, NBQ, ACC_LOW>(s, pa, [&](int qi) { return del_s[qi]; }, c);
    c_to_a<T, NBQ>(pa, s);
    // ---- dK += dS^T Q
    gemm_pv<T, HD, BRI>(dk, pa, sQs, 0, lane);

    if constexpr (ACC_LOW) {
      if (((it + 1) * BRI) % p.block_q == 0 || it + 1 == n_it)
        dkdv_flush<T, ON>(dk, dv, flushed, gdk, gdv, key_a, key_b, T_, C3, c);
    }
    __syncthreads();  // stage st is refilled in the next iteration
  }

  dkdv_store<T, ON, ACC_LOW>(p, dk, dv, gdk, gdv, key_a, key_b, C3, c);
}

// ---- The dQ kernel's per-tile steps, shared with the sm_90 dQ kernel (flash_bwd_sm90.cuh)
// so both round at the same points. Fragments: the m16n8 C layout (rows g, g + 8 of a warp's
// 16; wgmma's accumulator layout too).

// The thread's two rows' lse and delta (0 past T; delta 0 in the delta pass, which makes it).
template <bool DELTA>
__device__ __forceinline__ void dq_row_inputs(const BwdParams& p, int bh, int row_a, int row_b,
                                              float (&lse_r)[2], float (&del_r)[2]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int row = ri ? row_b : row_a;
    const int64_t r = static_cast<int64_t>(bh) * p.T + row;
    lse_r[ri] = row < p.T ? p.lse[r] : 0.f;
    del_r[ri] = !DELTA && row < p.T ? p.delta[r] : 0.f;
  }
}
// P = round_T(exp(scale S - lse)) of a key tile in place of S; masked entries (and rows past
// T) 0.
template <class T, int NB>
__device__ __forceinline__ void dq_tile_p(float (&s)[NB][4], const BwdParams& p,
                                          const float (&lse_r)[2], int kv0, int row_a, int row_b,
                                          int c, bool need_mask) {
  scale_scores<T, NB>(s, p.scale, p.scores_low);
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nb][e] = round_t<T>(fexp(__fsub_rn(s[nb][e], lse_r[e >> 1])));
  if (need_mask) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = kv0 + nb * 8 + 2 * c + (e & 1);
        const int row = e < 2 ? row_a : row_b;
        if (row >= p.T || col >= p.T || (p.causal && col > row)) s[nb][e] = 0.f;
      }
  }
}
// From dP (in s) and P (pa, A fragments): DELTA, the row sums of dP * P into dsum; else
// dS = round_T(P * fl32(dP - delta)) in place of dP.
template <class T, int NB, bool DELTA, bool ACC_LOW>
__device__ __forceinline__ void dq_tile_ds(float (&s)[NB][4], const uint32_t (&pa)[NB / 2][4],
                                           const float (&del_r)[2], float (&dsum)[2]) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float dp = s[nb][e];
      if constexpr (ACC_LOW) dp = round_t<T>(dp);
      if constexpr (DELTA)
        dsum[e >> 1] = __fmaf_rn(dp, a_elem<T, NB>(pa, nb, e), dsum[e >> 1]);
      else
        s[nb][e] = mul_round<T>(a_elem<T, NB>(pa, nb, e), __fsub_rn(dp, del_r[e >> 1]));
    }
}
// ACC_LOW: dQ flushed into dqkv and restarted from zero.
template <class T, int ON>
__device__ __forceinline__ void dq_flush(float (&dq)[ON][4], bool& flushed, T* gdq, int row_a,
                                         int row_b, int T_, int64_t C3, int c) {
  add_partial<T, ON>(dq, flushed, gdq, row_a, row_b, T_, C3, c);
  flushed = true;
  zero_acc<ON>(dq);
}
// The end of the rows: DELTA, delta = the row sums (quad reduction); else dQ = round_T(scale
// dQ) (ACC_LOW: of the T accumulator in dqkv).
template <class T, int ON, bool DELTA, bool ACC_LOW>
__device__ __forceinline__ void dq_store(const BwdParams& p, const float (&dq)[ON][4],
                                         const float (&dsum)[2], T* gdq, int row_a, int row_b,
                                         int bh, int64_t C3, int c) {
  const int T_ = p.T;
  if constexpr (DELTA) {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      float d = quad_sum(dsum[ri]);
      if constexpr (ACC_LOW) d = round_t<T>(d);
      const int row = ri ? row_b : row_a;
      if (c == 0 && row < T_) p.delta[static_cast<int64_t>(bh) * T_ + row] = d;
    }
  } else {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int row = ri ? row_b : row_a;
      if (row >= T_) continue;
      const int64_t off = static_cast<int64_t>(row) * C3 + 2 * c;
#pragma unroll
      for (int nb = 0; nb < ON; ++nb) {
        uint32_t* pq = reinterpret_cast<uint32_t*>(gdq + off + nb * 8);
        float v0, v1;
        if constexpr (ACC_LOW) {
          const float2 o = unpack2<T>(*pq);
          v0 = o.x;
          v1 = o.y;
        } else {
          v0 = dq[nb][2 * ri];
          v1 = dq[nb][2 * ri + 1];
        }
        *pq = pack2<T>(mul_round<T>(v0, p.scale), mul_round<T>(v1, p.scale));
      }
    }
  }
}

template <class T, int HD, int BRQ, int BCI, bool DELTA, bool ACC_LOW>
__global__ void __launch_bounds__(BRQ * 2) dq_kernel(const BwdParams p) {
  constexpr int NT = BRQ * 2;
  constexpr int P = kPitch<HD>;
  constexpr int NB = BCI / 8;
  constexpr int ON = HD / 8;
  constexpr uint32_t kStage = BCI * P * 2;
  ST_SHARED_DYNAMIC(unsigned char, smem, 128);
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sdO = sQ + BRQ * P * 2;
  const uint32_t sK = sdO + BRQ * P * 2;  // 2 stages
  const uint32_t sV = sK + 2 * kStage;    // 2 stages

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int T_ = p.T, NH = p.NH;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BRQ;
  const int64_t C = static_cast<int64_t>(NH) * HD, C3 = 3 * C;
  const T* gq = static_cast<const T*>(p.qkv) + static_cast<int64_t>(b) * T_ * C3 + h * HD;
  const T* gk = gq + C;
  const T* gv = gq + 2 * C;
  const T* gdo = static_cast<const T*>(p.dout) + static_cast<int64_t>(b) * T_ * C + h * HD;
  const int kv_end = p.causal ? min(T_, q0 + BRQ) : T_;
  const int n_kv = (kv_end + BCI - 1) / BCI;

  load_tile<BRQ, HD, NT>(sQ, gq, C3, q0, T_, tid);
  load_tile<BRQ, HD, NT>(sdO, gdo, C, q0, T_, tid);
  load_tile<BCI, HD, NT>(sK, gk, C3, 0, kv_end, tid);
  load_tile<BCI, HD, NT>(sV, gv, C3, 0, kv_end, tid);
  cp_async_commit();

  const int row_a = q0 + warp * 16 + g, row_b = row_a + 8;
  float lse_r[2], del_r[2];
  dq_row_inputs<DELTA>(p, bh, row_a, row_b, lse_r, del_r);
  float dq[ON][4];
#pragma unroll
  for (int nb = 0; nb < ON; ++nb) dq[nb][0] = dq[nb][1] = dq[nb][2] = dq[nb][3] = 0.f;
  float dsum[2] = {0.f, 0.f};  // DELTA: this thread's part of rowsum(dP * P)
  bool flushed = false;
  T* gdq = static_cast<T*>(p.dqkv) + static_cast<int64_t>(b) * T_ * C3 + h * HD;

  for (int j = 0; j < n_kv; ++j) {
    const int st = j & 1;
    if (j + 1 < n_kv) {
      load_tile<BCI, HD, NT>(sK + (st ^ 1) * kStage, gk, C3, (j + 1) * BCI, kv_end, tid);
      load_tile<BCI, HD, NT>(sV + (st ^ 1) * kStage, gv, C3, (j + 1) * BCI, kv_end, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int kv0 = j * BCI;
    const uint32_t sKs = sK + st * kStage, sVs = sV + st * kStage;
    const bool need_mask = q0 + BRQ > T_ || kv0 + BCI > T_ || (p.causal && kv0 + BCI - 1 > q0);

    // ---- S = Q K^T, P (16 queries x BCI keys per warp)
    float s[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
    gemm_abt<T, HD, NB>(s, sQ, warp * 16, sKs, 0, lane);
    dq_tile_p<T, NB>(s, p, lse_r, kv0, row_a, row_b, c, need_mask);
    uint32_t pa[BCI / 16][4];
    c_to_a<T, NB>(pa, s);
    // ---- dP = dO V^T
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
    gemm_abt<T, HD, NB>(s, sdO, warp * 16, sVs, 0, lane);
    dq_tile_ds<T, NB, DELTA, ACC_LOW>(s, pa, del_r, dsum);
    if constexpr (!DELTA) {
      c_to_a<T, NB>(pa, s);
      // ---- dQ += dS K
      gemm_pv<T, HD, BCI>(dq, pa, sKs, 0, lane);
      if constexpr (ACC_LOW) {
        if (((j + 1) * BCI) % p.block_k == 0 || j + 1 == n_kv)
          dq_flush<T, ON>(dq, flushed, gdq, row_a, row_b, T_, C3, c);
      }
    }
    __syncthreads();  // stage st is refilled in the next iteration
  }

  dq_store<T, ON, DELTA, ACC_LOW>(p, dq, dsum, gdq, row_a, row_b, bh, C3, c);
}

template <class T, int HD, bool ACC_LOW>
void launch_bwd(const BwdParams& p, cudaStream_t stream) {
  constexpr int BRI = kBri<HD>;
  constexpr int P = kPitch<HD>;
  {
    constexpr int kSmem = (2 * kBck * P + 4 * BRI * P) * 2 + 4 * BRI * 4;
    auto kernel = dkdv_kernel<T, HD, kBck, BRI, ACC_LOW>;
    ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    const dim3 grid(static_cast<unsigned>(p.B * p.NH),
                    static_cast<unsigned>((p.T + kBck - 1) / kBck));
    cudak::launch(kernel, grid, kBck * 2, kSmem, stream, p);
    ST_CUDA_CHECK_LAUNCH("flash dkdv_kernel");
  }
  {
    constexpr int kSmem = (2 * kBrq * P + 4 * kBci * P) * 2;
    auto kernel = dq_kernel<T, HD, kBrq, kBci, false, ACC_LOW>;
    ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    const dim3 grid(static_cast<unsigned>(p.B * p.NH),
                    static_cast<unsigned>((p.T + kBrq - 1) / kBrq));
    cudak::launch(kernel, grid, kBrq * 2, kSmem, stream, p);
    ST_CUDA_CHECK_LAUNCH("flash dq_kernel");
  }
}

template <class T, int HD, bool ACC_LOW>
void launch_delta_dpp(const BwdParams& p, cudaStream_t stream) {
  constexpr int P = kPitch<HD>;
  constexpr int kSmem = (2 * kBrq * P + 4 * kBci * P) * 2;
  auto kernel = dq_kernel<T, HD, kBrq, kBci, true, ACC_LOW>;
  ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(static_cast<unsigned>(p.B * p.NH),
                  static_cast<unsigned>((p.T + kBrq - 1) / kBrq));
  cudak::launch(kernel, grid, kBrq * 2, kSmem, stream, p);
  ST_CUDA_CHECK_LAUNCH("flash delta (dp_p) kernel");
}

inline void check_bwd(const BwdParams& p, bool acc_low) {
  ST_CHECK(p.B * p.NH > 0 && p.T > 0, "flash backward: empty problem");
  ST_CHECK((p.T + kBck - 1) / kBck <= 65535, "flash backward: T = ", p.T, " is too long");
  ST_CHECK(!acc_low || (p.block_q % 64 == 0 && p.block_k % kBci == 0),
           "flash backward: accumulator tiles ", p.block_q, " x ", p.block_k);
}

template <class T>
void bwd_dispatch(const BwdParams& p, bool acc_low, cudaStream_t s) {
  check_bwd(p, acc_low);
  if (p.hs == 64) return acc_low ? launch_bwd<T, 64, true>(p, s) : launch_bwd<T, 64, false>(p, s);
  if (p.hs == 128)
    return acc_low ? launch_bwd<T, 128, true>(p, s) : launch_bwd<T, 128, false>(p, s);
  fail("flash attention (CUDA): head size ", p.hs, " is not supported (64 or 128)");
}

template <class T>
void delta_dpp_dispatch(const BwdParams& p, bool acc_low, cudaStream_t s) {
  check_bwd(p, acc_low);
  if (p.hs == 64)
    return acc_low ? launch_delta_dpp<T, 64, true>(p, s) : launch_delta_dpp<T, 64, false>(p, s);
  if (p.hs == 128)
    return acc_low ? launch_delta_dpp<T, 128, true>(p, s) : launch_delta_dpp<T, 128, false>(p, s);
  fail("flash attention (CUDA): head size ", p.hs, " is not supported (64 or 128)");
}

}  // namespace st::flash
