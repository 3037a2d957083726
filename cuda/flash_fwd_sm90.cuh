// Flash attention forward for Hopper (sm_90a): the FlashAttention-3 structure with our
// rounding points. Included by flash_fwd_sm90_bf16.cu and flash_fwd_sm90_f16.cu, which are
// built for compute_90a only (cuda/CMakeLists.txt); the SIMT emulator runs the same source
// (tests/simt/README.md, "Hopper").
//
// Numerics: exactly the mma.sync kernel's (flash_fwd.cuh), whose softmax_tile, scale_acc,
// merge_pv_low and store_rows this kernel calls: per key tile of BC = 128 columns,
// S = scale * Q K^T (FP32 accumulation, K = 16 per instruction, in order), the online
// softmax, P~ rounded to T, O~ = alpha O~ + P~ V (or the ACC_LOW formula). The emulator
// gives this kernel the same bits as the mma.sync kernel at tiles (128, 128); on a GPU the
// tensor cores' summation inside one K = 16 step may differ (documented bound: README).
//
// Work decomposition: grid (B*NH, ceil(T / 128)), heaviest query tile first; 384 threads =
// three warpgroups. Warpgroup 0 is the producer: it gives up registers (setmaxnreg 24), and
// one thread issues the TMA copies: Q once, then K_j and V_j into two shared stages, each
// completing on its own mbarrier (k_full, v_full), after waiting for the consumers to release
// the stage (kv_empty, one arrival per consumer warp). Warpgroups 1 and 2 are consumers
// (setmaxnreg 240), 64 query rows each: S_j with wgmma (A = Q, B = K_j, both K-major from
// 128-byte-swizzled shared memory), the softmax in registers, then O~ += P~ V_j with wgmma
// (A = P~ from registers: the S accumulators converted in place to A fragments, B = V_j
// MN-major). Ping-pong: named barriers make the two consumer warpgroups take turns issuing
// their GEMMs, so one warpgroup's softmax runs while the other's GEMMs use the tensor cores;
// and within a warpgroup, S_{j+1} is issued before P~_j V_j, so the softmax of tile j + 1
// overlaps that GEMM (FA3's two overlaps).
//
// Shared memory (1024-byte aligned; 128-byte swizzle, TMA boxes of 64 columns x 128 rows):
// Q (HD/64 boxes), K and V (2 stages x HD/64 boxes each), then the mbarriers.
// Rows past T come in as zeros (TMA out-of-bounds fill), as the mma.sync kernel's zero fill.
#pragma once
#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/flash_common.cuh"
#include "cuda/flash_fwd.cuh"
#include "cuda/flash_launch.cuh"
#include "cuda/flash_sm90.cuh"
#include "cuda/launch.cuh"

namespace st::flash::sm90 {

using ptx::TmaMap;

constexpr int kBR = 128, kBC = 128;
constexpr uint32_t kBox = kBoxBytes<128>;  // one 64-column box of 128 rows

template <int HD>
struct Layout {
  static constexpr int kBoxes = HD / 64;
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kK = kQ + kBoxes * kBox;       // stage s at kK + s * kStage
  static constexpr uint32_t kStage = kBoxes * kBox;
  static constexpr uint32_t kV = kK + 2 * kStage;
  static constexpr uint32_t kBars = kV + 2 * kStage;       // KvBars (first: Q)
  static constexpr uint32_t kBytes = kBars + kKvBarsBytes;
  static constexpr size_t kSmem = kBytes + 1024;           // + the alignment of the base
};

struct Maps {
  TmaMap qkv;  // (3C, T, B), box (64, 128, 1), 128-byte swizzle
};

template <class T, int HD, bool STAB, bool ACC_LOW>
__global__ void __launch_bounds__(kThreads, 1)
    fwd_kernel(const FwdParams p, const ST_GRID_CONSTANT Maps maps) {
  using L = Layout<HD>;
  constexpr int NB = kBC / 8;  // S n-blocks per thread
  constexpr int ON = HD / 8;   // O n-blocks per thread
  ST_SHARED_DYNAMIC(unsigned char, smem_raw, 128);
  const uint32_t base = aligned_base(smem_raw);
  const uint32_t sQ = base + L::kQ, sK = base + L::kK, sV = base + L::kV;
  const KvBars bars{base + L::kBars};

  const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31, warp = (tid / 32) % 4;
  const int T_ = p.T, NH = p.NH;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBR;
  const int C = NH * HD;
  const int kv_end = p.causal ? min(T_, q0 + kBR) : T_;
  const int n_kv = (kv_end + kBC - 1) / kBC;

  if (tid == 0) bars.init(8);  // kv_empty: one arrival per consumer warp
  __syncthreads();

  if (wg == 0) {
    // ---- producer
    ptx::setmaxnreg_dec<24>();
    if (tid != 0) return;
    ptx::mbar_arrive_expect_tx(bars.first(), L::kBoxes * kBox);
    for (int a = 0; a < L::kBoxes; ++a)
      ptx::tma_load_3d(sQ + a * kBox, maps.qkv, h * HD + a * 64, q0, b, bars.first());
    produce_pairs<L::kBoxes, kBC>(bars, maps.qkv, maps.qkv, sK, sV, C + h * HD, 2 * C + h * HD, b,
                                  0, n_kv);
    return;
  }

  // ---- consumers: warpgroup cw (0, 1) owns query rows q0 + 64 cw .. + 64
  ptx::setmaxnreg_inc<240>();
  const int cw = wg - 1;
  const int g = lane >> 2, c = lane & 3;
  const int row_a = q0 + cw * 64 + warp * 16 + g, row_b = row_a + 8;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float acc[ON][4];
  uint32_t acl[ON][2];
#pragma unroll
  for (int nb = 0; nb < ON; ++nb) {
    acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
    acl[nb][0] = acl[nb][1] = 0u;
  }
  int ptilde[2] = {0, 0};
  // Ping-pong: warpgroup cw issues its GEMMs after bar.sync (1 + cw), and then lets the
  // other one go (bar.arrive on the other's id); consumer 1 lets consumer 0 go first.
  constexpr int kPair = 256;
  if (cw == 1) ptx::named_bar_arrive(1, kPair);
  ptx::mbar_wait(bars.first(), 0);

  // Software pipelining inside the warpgroup (FA3's intra-warpgroup overlap): in the steady
  // state, iteration j issues S_j = Q K_j^T, then O~ += P~_{j-1} V_{j-1}, and runs the
  // softmax of S_j while the tensor cores work on the second; the first tile's S and the last
  // tile's P~V are peeled off, so no wgmma sits under a run-time condition. O~ is scaled by
  // alpha_j only once P~_{j-1} V_{j-1} has retired, so O~ goes through the mma.sync kernel's
  // operations in its order (scale by alpha_j, then + P~_j V_j). The A registers of a wgmma
  // in flight (pa) are rewritten only after it retires.
  uint32_t pa[kBC / 16][4];  // P~_{j-1} as A fragments
  float alpha_prev[2] = {0.f, 0.f};
  float pv[ON][4];  // ACC_LOW: P~_{j-1} V_{j-1} from zero
  float(&o)[HD / 2] = reinterpret_cast<float(&)[HD / 2]>(ACC_LOW ? pv : acc);
  auto issue_s = [&](int j, float(&sc)[kBC / 2]) {
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks)
      ptx::wgmma_ss<T, kBC, 0, 0>(sc, desc_kmajor<kBR>(sQ, cw * 64, ks),
                                  desc_kmajor<kBC>(sK + (j & 1) * L::kStage, 0, ks), ks > 0);
    ptx::wgmma_commit();
  };
  auto issue_pv = [&](int j) {
#pragma unroll
    for (int kk = 0; kk < kBC / 16; ++kk)
      ptx::wgmma_rs<T, HD, 1>(o, pa[kk], desc_mn<kBC>(sV + (j & 1) * L::kStage, kk), !ACC_LOW || kk > 0);
    ptx::wgmma_commit();
  };
  // S_j retired: the softmax; then (after P~_{j-1} V_{j-1} has retired) O~ scaled and P~_j
  // made the next A operand.
  auto softmax = [&](int j, float(&sc)[NB][4], float(&alpha)[2]) {
    const int kv0 = j * kBC;
    const bool need_mask = kv0 + kBC > T_ || (p.causal && kv0 + kBC - 1 > q0 + cw * 64);
    softmax_tile<T, NB, STAB, ACC_LOW>(sc, m, l, alpha, ptilde, p, kv0, row_a, row_b, c,
                                       need_mask);
  };
  auto next_pv = [&](float(&sc)[NB][4], const float(&alpha)[2]) {
    if constexpr (!ACC_LOW) scale_acc<ON>(acc, alpha);  // before P~_j V_j is added
    alpha_prev[0] = alpha[0];
    alpha_prev[1] = alpha[1];
    c_to_a<T, NB>(pa, sc);
  };
  auto retire_pv = [&](int j) {  // after wgmma_wait: merge (ACC_LOW), release the stage
    ptx::fence_operand(o);
    if constexpr (ACC_LOW) merge_pv_low<T, ON>(acl, alpha_prev, pv);
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(bars.kv_empty(j & 1));  // this warp has read stage j & 1
  };

  {  // tile 0: S only
    float sc[NB][4], alpha[2];
    float(&scf)[kBC / 2] = reinterpret_cast<float(&)[kBC / 2]>(sc);
    ptx::mbar_wait(bars.k_full(0), 0);
    ptx::named_bar_sync(1 + cw, kPair);
    ptx::wgmma_fence();
    issue_s(0, scf);
    ptx::named_bar_arrive(1 + (1 - cw), kPair);  // the other warpgroup's turn
    ptx::wgmma_wait<0>();
    ptx::fence_operand(scf);
    softmax(0, sc, alpha);
    next_pv(sc, alpha);
  }
  for (int j = 1; j < n_kv; ++j) {  // S_j and P~_{j-1} V_{j-1}
    float sc[NB][4], alpha[2];
    float(&scf)[kBC / 2] = reinterpret_cast<float(&)[kBC / 2]>(sc);
    ptx::mbar_wait(bars.k_full(j & 1), (j >> 1) & 1);
    ptx::mbar_wait(bars.v_full((j - 1) & 1), ((j - 1) >> 1) & 1);
    ptx::named_bar_sync(1 + cw, kPair);
    ptx::fence_operand(o);
    ptx::wgmma_fence();
    issue_s(j, scf);
    issue_pv(j - 1);
    ptx::named_bar_arrive(1 + (1 - cw), kPair);
    ptx::wgmma_wait<1>();
    ptx::fence_operand(scf);
    softmax(j, sc, alpha);
    ptx::wgmma_wait<0>();
    retire_pv(j - 1);
    next_pv(sc, alpha);
  }
  {  // the last tile's P~V
    const int j = n_kv - 1;
    ptx::mbar_wait(bars.v_full(j & 1), (j >> 1) & 1);
    ptx::named_bar_sync(1 + cw, kPair);
    ptx::fence_operand(o);
    ptx::wgmma_fence();
    issue_pv(j);
    ptx::named_bar_arrive(1 + (1 - cw), kPair);
    ptx::wgmma_wait<0>();
    retire_pv(j);
  }
  store_rows<T, HD, ACC_LOW>(p, acc, acl, m, l, ptilde, row_a, row_b, bh, c);
}

template <class T, int HD, bool STAB, bool ACC_LOW>
void launch(const FwdParams& p, cudaStream_t stream) {
  using L = Layout<HD>;
  Maps maps;
  maps.qkv = tma_rows(p.qkv, 3LL * p.NH * HD, p.T, p.B, kBC);  // Q, K and V boxes of 128 rows
  auto kernel = fwd_kernel<T, HD, STAB, ACC_LOW>;
  ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(L::kSmem)));
  const dim3 grid(static_cast<unsigned>(p.B * p.NH), static_cast<unsigned>((p.T + kBR - 1) / kBR));
  cudak::launch(kernel, grid, kThreads, L::kSmem, stream, p, maps);
  ST_CUDA_CHECK_LAUNCH("flash sm90 fwd_kernel");
}

template <class T>
void dispatch(const FwdParams& p, bool stab, bool acc_low, cudaStream_t s) {
  ST_CHECK(p.B * p.NH > 0 && p.T > 0, "flash forward (sm_90): empty problem");
  ST_CHECK((p.T + kBR - 1) / kBR <= 65535, "flash forward (sm_90): T = ", p.T, " is too long");
  auto go = [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    if (stab)
      acc_low ? launch<T, HD, true, true>(p, s) : launch<T, HD, true, false>(p, s);
    else
      acc_low ? launch<T, HD, false, true>(p, s) : launch<T, HD, false, false>(p, s);
  };
  if (p.hs == 64) return go(std::integral_constant<int, 64>{});
  if (p.hs == 128) return go(std::integral_constant<int, 128>{});
  fail("flash attention (CUDA, sm_90 kernel): head size ", p.hs, " is not supported (64 or 128)");
}

}  // namespace st::flash::sm90
