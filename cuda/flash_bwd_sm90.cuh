// Flash attention backward on Hopper (sm_90a): the dK/dV kernel, the dQ kernel and the dp_p
// delta pass with TMA, mbarriers and wgmma. Included by flash_bwd_sm90_bf16.cu and
// flash_bwd_sm90_f16.cu (built for compute_90a only). The dK/dV kernel is described at its
// definition below; the dQ kernel and the delta pass here.
//
// Numerics: exactly the mma.sync dQ kernel's (flash_bwd.cuh), whose per-tile steps this kernel
// calls (dq_tile_p, dq_tile_ds, dq_flush, dq_store), at its tiles: 128 query rows a block,
// key tiles of 64, every K = 16 step of S = Q K^T, dP = dO V^T and dQ += dS K in its order.
// So on the SIMT emulator it gives the mma.sync kernel's bits; on a GPU the tensor cores'
// summation inside one K = 16 step may differ.
//
// Work decomposition: grid (B*NH, ceil(T / 128)), heaviest query tile first; 384 threads.
// Warpgroup 0 is the producer (setmaxnreg 24; one thread issues TMA): Q and dO once, then
// K_j and V_j into two stages (k_full, v_full), each stage reused once the 8 consumer warps
// have released it (kv_empty). Warpgroups 1 and 2 are consumers (setmaxnreg 240), 64 query
// rows each: S_j and dP_j issued together (A = Q, dO; B = K_j, V_j; K-major), P from S while
// dP runs, dS, then dQ += dS K_j (A = dS from registers, B = K_j MN-major). The two consumer
// warpgroups take turns issuing their GEMMs (named barriers), as in the forward.
#pragma once
#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/flash_bwd.cuh"
#include "cuda/flash_common.cuh"
#include "cuda/flash_launch.cuh"
#include "cuda/flash_sm90.cuh"
#include "cuda/launch.cuh"

namespace st::flash::sm90 {

using ptx::TmaMap;

constexpr int kBRQ = 128, kBCI = 64;

template <int HD>
struct DqLayout {
  static constexpr int kBoxes = HD / 64;
  static constexpr uint32_t kRowTile = kBoxes * kBoxBytes<kBRQ>;  // Q or dO
  static constexpr uint32_t kKvTile = kBoxes * kBoxBytes<kBCI>;   // one stage of K or V
  static constexpr uint32_t kQ = 0, kdO = kRowTile, kK = 2 * kRowTile;
  static constexpr uint32_t kV = kK + 2 * kKvTile;
  static constexpr uint32_t kBars = kV + 2 * kKvTile;  // KvBars (first: Q and dO)
  static constexpr size_t kSmem = kBars + kKvBarsBytes + 1024;
};

struct DqMaps {
  TmaMap q;   // qkv, boxes of 128 rows (Q)
  TmaMap kv;  // qkv, boxes of 64 rows (K, V)
  TmaMap dout;
};

template <class T, int HD, bool DELTA, bool ACC_LOW>
__global__ void __launch_bounds__(kThreads, 1)
    dq_kernel(const BwdParams p, const ST_GRID_CONSTANT DqMaps maps) {
  using L = DqLayout<HD>;
  constexpr int NB = kBCI / 8;  // S, dP n-blocks per thread
  constexpr int ON = HD / 8;    // dQ n-blocks per thread
  ST_SHARED_DYNAMIC(unsigned char, smem_raw, 128);
  const uint32_t base = aligned_base(smem_raw);
  const uint32_t sQ = base + L::kQ, sdO = base + L::kdO, sK = base + L::kK, sV = base + L::kV;
  const KvBars bars{base + L::kBars};

  const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31, warp = (tid / 32) % 4;
  const int T_ = p.T, NH = p.NH;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBRQ;
  const int C = NH * HD;
  const int kv_end = p.causal ? min(T_, q0 + kBRQ) : T_;
  const int n_kv = (kv_end + kBCI - 1) / kBCI;

  if (tid == 0) bars.init(8);  // kv_empty: one arrival per consumer warp
  __syncthreads();

  if (wg == 0) {
    // ---- producer
    ptx::setmaxnreg_dec<24>();
    if (tid != 0) return;
    ptx::mbar_arrive_expect_tx(bars.first(), 2 * L::kRowTile);  // Q and dO
    for (int a = 0; a < L::kBoxes; ++a) {
      ptx::tma_load_3d(sQ + a * kBoxBytes<kBRQ>, maps.q, h * HD + a * 64, q0, b, bars.first());
      ptx::tma_load_3d(sdO + a * kBoxBytes<kBRQ>, maps.dout, h * HD + a * 64, q0, b, bars.first());
    }
    produce_pairs<L::kBoxes, kBCI>(bars, maps.kv, maps.kv, sK, sV, C + h * HD, 2 * C + h * HD, b,
                                   0, n_kv);
    return;
  }

  // ---- consumers: warpgroup cw (0, 1) owns query rows q0 + 64 cw .. + 64
  ptx::setmaxnreg_inc<240>();
  const int cw = wg - 1;
  const int g = lane >> 2, c = lane & 3;
  const int row_a = q0 + cw * 64 + warp * 16 + g, row_b = row_a + 8;
  const int64_t C3 = 3LL * C;
  float lse_r[2], del_r[2];
  dq_row_inputs<DELTA>(p, bh, row_a, row_b, lse_r, del_r);
  float dq[ON][4];
#pragma unroll
  for (int nb = 0; nb < ON; ++nb) dq[nb][0] = dq[nb][1] = dq[nb][2] = dq[nb][3] = 0.f;
  float dsum[2] = {0.f, 0.f};
  bool flushed = false;
  T* gdq = static_cast<T*>(p.dqkv) + static_cast<int64_t>(b) * T_ * C3 + h * HD;
  constexpr int kPair = 256;
  if (cw == 1) ptx::named_bar_arrive(1, kPair);
  ptx::mbar_wait(bars.first(), 0);

  for (int j = 0; j < n_kv; ++j) {
    const int s = j & 1;
    const uint32_t par = (j >> 1) & 1;
    const uint32_t sKs = sK + s * L::kKvTile, sVs = sV + s * L::kKvTile;
    ptx::mbar_wait(bars.k_full(s), par);
    ptx::mbar_wait(bars.v_full(s), par);
    float sc[NB][4], dp[NB][4];
    float(&scf)[kBCI / 2] = reinterpret_cast<float(&)[kBCI / 2]>(sc);
    float(&dpf)[kBCI / 2] = reinterpret_cast<float(&)[kBCI / 2]>(dp);
    ptx::named_bar_sync(1 + cw, kPair);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks)
      ptx::wgmma_ss<T, kBCI, 0, 0>(scf, desc_kmajor<kBRQ>(sQ, cw * 64, ks),
                                   desc_kmajor<kBCI>(sKs, 0, ks), ks > 0);
    ptx::wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks)
      ptx::wgmma_ss<T, kBCI, 0, 0>(dpf, desc_kmajor<kBRQ>(sdO, cw * 64, ks),
                                   desc_kmajor<kBCI>(sVs, 0, ks), ks > 0);
    ptx::wgmma_commit();
    if constexpr (DELTA) ptx::named_bar_arrive(1 + (1 - cw), kPair);
    const int kv0 = j * kBCI;
    const bool need_mask =
        q0 + kBRQ > T_ || kv0 + kBCI > T_ || (p.causal && kv0 + kBCI - 1 > q0);
    if constexpr (DELTA && ACC_LOW)
      ptx::wgmma_wait<0>();  // S and dP (overlapping them here made ptxas serialise, C7514)
    else
      ptx::wgmma_wait<1>();  // S
    ptx::fence_operand(scf);
    dq_tile_p<T, NB>(sc, p, lse_r, kv0, row_a, row_b, c, need_mask);
    uint32_t pa[kBCI / 16][4];
    c_to_a<T, NB>(pa, sc);
    ptx::wgmma_wait<0>();  // dP
    ptx::fence_operand(dpf);
    dq_tile_ds<T, NB, DELTA, ACC_LOW>(dp, pa, del_r, dsum);
    if constexpr (!DELTA) {
      uint32_t da[kBCI / 16][4];
      c_to_a<T, NB>(da, dp);
      // ---- dQ += dS K_j
      float(&dqf)[HD / 2] = reinterpret_cast<float(&)[HD / 2]>(dq);
      ptx::fence_operand(dqf);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBCI / 16; ++kk)
        ptx::wgmma_rs<T, HD, 1>(dqf, da[kk], desc_mn<kBCI>(sKs, kk), true);
      ptx::wgmma_commit();
      ptx::named_bar_arrive(1 + (1 - cw), kPair);
      ptx::wgmma_wait<0>();
      ptx::fence_operand(dqf);
      if constexpr (ACC_LOW) {
        if (((j + 1) * kBCI) % p.block_k == 0 || j + 1 == n_kv)
          dq_flush<T, ON>(dq, flushed, gdq, row_a, row_b, T_, C3, c);
      }
    }
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(bars.kv_empty(s));  // this warp has read stage s
  }
  dq_store<T, ON, DELTA, ACC_LOW>(p, dq, dsum, gdq, row_a, row_b, bh, C3, c);
}

template <class T, int HD, bool DELTA, bool ACC_LOW>
void launch_dq(const BwdParams& p, cudaStream_t stream) {
  using L = DqLayout<HD>;
  DqMaps maps;
  const int64_t C = static_cast<int64_t>(p.NH) * HD;
  maps.q = tma_rows(p.qkv, 3 * C, p.T, p.B, kBRQ);
  maps.kv = tma_rows(p.qkv, 3 * C, p.T, p.B, kBCI);
  maps.dout = tma_rows(p.dout, C, p.T, p.B, kBRQ);
  auto kernel = dq_kernel<T, HD, DELTA, ACC_LOW>;
  ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(L::kSmem)));
  const dim3 grid(static_cast<unsigned>(p.B * p.NH), static_cast<unsigned>((p.T + kBRQ - 1) / kBRQ));
  cudak::launch(kernel, grid, kThreads, L::kSmem, stream, p, maps);
  ST_CUDA_CHECK_LAUNCH(DELTA ? "flash sm90 delta (dp_p) kernel" : "flash sm90 dq_kernel");
}

// ---- dK/dV: 128 keys a block (64 per consumer warpgroup), query tiles of kBri<HD> rows
// (64 at d = 64, 32 at d = 128, as the mma.sync kernel) streamed through two stages; K and V
// resident. Per query tile: S^T = K Q^T and dP^T = V dO^T issued together (A = K, V rows;
// B = Q, dO, K-major), P^T from S^T while dP^T runs, dV += P^T dO (A = P^T from registers,
// B = dO MN-major), dS^T, dK += dS^T Q (B = Q MN-major). lse and delta of the tile's queries
// are read from global memory (0 past T, as the mma.sync kernel's zero-filled tiles).
constexpr int kBCK = 128;

template <int HD>
struct DkdvLayout {
  static constexpr int kBoxes = HD / 64;
  static constexpr int kRows = kBri<HD>;
  static constexpr uint32_t kKeyTile = kBoxes * kBoxBytes<kBCK>;  // K or V
  static constexpr uint32_t kQTile = kBoxes * kBoxBytes<kRows>;   // one stage of Q or dO
  static constexpr uint32_t kK = 0, kV = kKeyTile, kQ = 2 * kKeyTile;
  static constexpr uint32_t kdO = kQ + 2 * kQTile;
  static constexpr uint32_t kBars = kdO + 2 * kQTile;  // KvBars (first: K and V)
  static constexpr size_t kSmem = kBars + kKvBarsBytes + 1024;
};

struct DkdvMaps {
  TmaMap keys;  // qkv, boxes of 128 rows (K, V)
  TmaMap q;     // qkv, boxes of kBri rows
  TmaMap dout;  // dout, boxes of kBri rows
};

template <class T, int HD, bool ACC_LOW>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_kernel(const BwdParams p, const ST_GRID_CONSTANT DkdvMaps maps) {
  using L = DkdvLayout<HD>;
  constexpr int BRI = L::kRows;
  constexpr int NBQ = BRI / 8;  // S^T, dP^T n-blocks (queries) per thread
  constexpr int ON = HD / 8;
  ST_SHARED_DYNAMIC(unsigned char, smem_raw, 128);
  const uint32_t base = aligned_base(smem_raw);
  const uint32_t sK = base + L::kK, sV = base + L::kV, sQ = base + L::kQ, sdO = base + L::kdO;
  const KvBars bars{base + L::kBars};

  const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31, warp = (tid / 32) % 4;
  const int T_ = p.T, NH = p.NH;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.y * kBCK;
  const int C = NH * HD;
  const int it0 = p.causal ? k0 / BRI : 0;
  const int n_it = (T_ + BRI - 1) / BRI;

  if (tid == 0) bars.init(8);  // kv_empty: one arrival per consumer warp
  __syncthreads();

  if (wg == 0) {
    // ---- producer
    ptx::setmaxnreg_dec<24>();
    if (tid != 0) return;
    ptx::mbar_arrive_expect_tx(bars.first(), 2 * L::kKeyTile);  // K and V
    for (int a = 0; a < L::kBoxes; ++a) {
      ptx::tma_load_3d(sK + a * kBoxBytes<kBCK>, maps.keys, C + h * HD + a * 64, k0, b, bars.first());
      ptx::tma_load_3d(sV + a * kBoxBytes<kBCK>, maps.keys, 2 * C + h * HD + a * 64, k0, b,
                       bars.first());
    }
    produce_pairs<L::kBoxes, BRI>(bars, maps.q, maps.dout, sQ, sdO, h * HD, h * HD, b, it0,
                                  n_it - it0);
    return;
  }

  // ---- consumers: warpgroup cw (0, 1) owns keys k0 + 64 cw .. + 64
  ptx::setmaxnreg_inc<240>();
  const int cw = wg - 1;
  const int g = lane >> 2, c = lane & 3;
  const int key_a = k0 + cw * 64 + warp * 16 + g, key_b = key_a + 8;
  const int64_t C3 = 3LL * C;
  const float* glse = p.lse + static_cast<int64_t>(bh) * T_;
  const float* gdel = p.delta + static_cast<int64_t>(bh) * T_;
  float dk[ON][4], dv[ON][4];
#pragma unroll
  for (int nb = 0; nb < ON; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nb][e] = dv[nb][e] = 0.f;
  float(&dkf)[HD / 2] = reinterpret_cast<float(&)[HD / 2]>(dk);
  float(&dvf)[HD / 2] = reinterpret_cast<float(&)[HD / 2]>(dv);
  bool flushed = false;
  T* gdk = static_cast<T*>(p.dqkv) + static_cast<int64_t>(b) * T_ * C3 + C + h * HD;
  T* gdv = gdk + C;
  constexpr int kPair = 256;
  if (cw == 1) ptx::named_bar_arrive(1, kPair);
  ptx::mbar_wait(bars.first(), 0);

  for (int it = it0; it < n_it; ++it) {
    const int j = it - it0, s = j & 1;
    const uint32_t par = (j >> 1) & 1;
    const uint32_t sQs = sQ + s * L::kQTile, sdOs = sdO + s * L::kQTile;
    const int q0 = it * BRI;
    const bool need_mask = q0 + BRI > T_ || k0 + kBCK > T_ || (p.causal && k0 + kBCK - 1 > q0);
    ptx::mbar_wait(bars.k_full(s), par);  // Q_it
    ptx::mbar_wait(bars.v_full(s), par);  // dO_it
    float st[NBQ][4], dpt[NBQ][4];
    float(&stf)[BRI / 2] = reinterpret_cast<float(&)[BRI / 2]>(st);
    float(&dptf)[BRI / 2] = reinterpret_cast<float(&)[BRI / 2]>(dpt);
    ptx::named_bar_sync(1 + cw, kPair);
    ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks)
      ptx::wgmma_ss<T, BRI, 0, 0>(stf, desc_kmajor<kBCK>(sK, cw * 64, ks),
                                  desc_kmajor<BRI>(sQs, 0, ks), ks > 0);
    ptx::wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks)
      ptx::wgmma_ss<T, BRI, 0, 0>(dptf, desc_kmajor<kBCK>(sV, cw * 64, ks),
                                  desc_kmajor<BRI>(sdOs, 0, ks), ks > 0);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // S^T
    ptx::fence_operand(stf);
    auto lse = [&](int qi) { return q0 + qi < T_ ? glse[q0 + qi] : 0.f; };
    dkdv_tile_p<T, NBQ>(st, p, lse, q0, key_a, key_b, c, need_mask);
    uint32_t pa[BRI / 16][4];
    c_to_a<T, NBQ>(pa, st);
    // ---- dV += P^T dO_it
    ptx::fence_operand(dvf);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BRI / 16; ++kk)
      ptx::wgmma_rs<T, HD, 1>(dvf, pa[kk], desc_mn<BRI>(sdOs, kk), true);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();  // dP^T
    ptx::fence_operand(dptf);
    auto del = [&](int qi) { return q0 + qi < T_ ? gdel[q0 + qi] : 0.f; };
    dkdv_tile_ds<T, NBQ, ACC_LOW>(dpt, pa, del, c);
    uint32_t da[BRI / 16][4];
    c_to_a<T, NBQ>(da, dpt);
    // ---- dK += dS^T Q_it
    ptx::fence_operand(dkf);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BRI / 16; ++kk)
      ptx::wgmma_rs<T, HD, 1>(dkf, da[kk], desc_mn<BRI>(sQs, kk), true);
    ptx::wgmma_commit();
    ptx::named_bar_arrive(1 + (1 - cw), kPair);  // the other warpgroup's turn
    ptx::wgmma_wait<0>();
    ptx::fence_operand(dvf);
    ptx::fence_operand(dkf);
    if constexpr (ACC_LOW) {
      if (((it + 1) * BRI) % p.block_q == 0 || it + 1 == n_it)
        dkdv_flush<T, ON>(dk, dv, flushed, gdk, gdv, key_a, key_b, T_, C3, c);
    }
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(bars.kv_empty(s));  // this warp has read stage s
  }
  dkdv_store<T, ON, ACC_LOW>(p, dk, dv, gdk, gdv, key_a, key_b, C3, c);
}

template <class T, int HD, bool ACC_LOW>
void launch_dkdv(const BwdParams& p, cudaStream_t stream) {
  using L = DkdvLayout<HD>;
  DkdvMaps maps;
  const int64_t C = static_cast<int64_t>(p.NH) * HD;
  maps.keys = tma_rows(p.qkv, 3 * C, p.T, p.B, kBCK);
  maps.q = tma_rows(p.qkv, 3 * C, p.T, p.B, L::kRows);
  maps.dout = tma_rows(p.dout, C, p.T, p.B, L::kRows);
  auto kernel = dkdv_kernel<T, HD, ACC_LOW>;
  ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(L::kSmem)));
  const dim3 grid(static_cast<unsigned>(p.B * p.NH), static_cast<unsigned>((p.T + kBCK - 1) / kBCK));
  cudak::launch(kernel, grid, kThreads, L::kSmem, stream, p, maps);
  ST_CUDA_CHECK_LAUNCH("flash sm90 dkdv_kernel");
}

template <class T>
void dkdv_dispatch(const BwdParams& p, bool acc_low, cudaStream_t s) {
  check_bwd(p, acc_low);
  if (p.hs == 64) return acc_low ? launch_dkdv<T, 64, true>(p, s) : launch_dkdv<T, 64, false>(p, s);
  if (p.hs == 128)
    return acc_low ? launch_dkdv<T, 128, true>(p, s) : launch_dkdv<T, 128, false>(p, s);
  fail("flash attention (CUDA, sm_90 kernel): head size ", p.hs, " is not supported (64 or 128)");
}

template <class T>
void dq_dispatch(const BwdParams& p, bool acc_low, bool delta_pass, cudaStream_t s) {
  check_bwd(p, acc_low);
  auto go = [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    if (delta_pass)
      acc_low ? launch_dq<T, HD, true, true>(p, s) : launch_dq<T, HD, true, false>(p, s);
    else
      acc_low ? launch_dq<T, HD, false, true>(p, s) : launch_dq<T, HD, false, false>(p, s);
  };
  if (p.hs == 64) return go(std::integral_constant<int, 64>{});
  if (p.hs == 128) return go(std::integral_constant<int, 128>{});
  fail("flash attention (CUDA, sm_90 kernel): head size ", p.hs, " is not supported (64 or 128)");
}

}  // namespace st::flash::sm90
