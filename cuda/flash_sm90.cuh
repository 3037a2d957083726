// Shared pieces of the sm_90 flash kernels (flash_fwd_sm90.cuh, flash_bwd_sm90.cuh): the
// shared-memory tile layout TMA writes and wgmma reads, and their descriptors.
//
// A tile of ROWS rows x HD columns of 16-bit elements is HD/64 boxes, one per 64 columns;
// box a holds rows r = 0..ROWS-1 at r * 128 bytes, each row's 128 bytes swizzled by TMA's
// 128-byte pattern (16-byte chunk index XOR r % 8), boxes 1024-byte aligned. The same bytes
// serve as a K-major operand (rows = M or N, columns = K: Q, K, dO in S = Q K^T, dP = dO V^T)
// and as an MN-major one (rows = K, columns = N: V in O = P V, K in dQ = dS K).
#pragma once
#include <cstdint>

#include "cuda/ptx.cuh"

namespace st::flash::sm90 {

template <int ROWS>
constexpr uint32_t kBoxBytes = ROWS * 128;

// Every sm_90 kernel: one producer warpgroup and two consumer warpgroups.
constexpr int kThreads = 384;

// The dynamic shared memory's first 1024-byte-aligned address (the 128-byte swizzle repeats
// every 1024 bytes and is computed from address bits; kernels allocate 1024 bytes more).
__device__ __forceinline__ uint32_t aligned_base(const void* smem) {
  return (ptx::smem_addr(smem) + 1023u) & ~1023u;
}

// K-major: rows row0.. of the tile, K = 16 columns from 16 ks: 32 bytes into the row for each
// of the 4 steps inside a box, then the next box; 8-row groups 1024 bytes apart (SBO; LBO is
// unused with a swizzle).
template <int ROWS>
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t tile, int row0, int ks) {
  return ptx::wgmma_desc(tile + (ks / 4) * kBoxBytes<ROWS> + row0 * 128 + (ks % 4) * 32, 16, 1024,
                         128);
}
// MN-major: K = rows 16 kk .. 16 kk + 15 (the next 8 rows 1024 bytes on: SBO), N = the
// columns, 64 to a box (the next 64 one box on: LBO).
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int kk) {
  return ptx::wgmma_desc(tile + kk * 16 * 128, kBoxBytes<ROWS>, 1024, 128);
}

// The mbarriers of a kernel that loads a resident tile once and streams K/V tiles through two
// stages: `first` (the resident tile), k_full[2] and v_full[2] (TMA completes them) and
// kv_empty[2] (one arrival per consumer warp releases a stage). 7 x 8 bytes at `at`.
struct KvBars {
  uint32_t at;
  __device__ __forceinline__ uint32_t first() const { return at; }
  __device__ __forceinline__ uint32_t k_full(int s) const { return at + 8 + 8 * s; }
  __device__ __forceinline__ uint32_t v_full(int s) const { return at + 24 + 8 * s; }
  __device__ __forceinline__ uint32_t kv_empty(int s) const { return at + 40 + 8 * s; }
  // By one thread, before a __syncthreads.
  __device__ __forceinline__ void init(uint32_t consumer_warps) const {
    ptx::mbar_init(first(), 1);
    for (int s = 0; s < 2; ++s) {
      ptx::mbar_init(k_full(s), 1);
      ptx::mbar_init(v_full(s), 1);
      ptx::mbar_init(kv_empty(s), consumer_warps);
    }
    ptx::fence_mbarrier_init();
  }
};
constexpr uint32_t kKvBarsBytes = 7 * 8;

// The producer thread's stream of tile pairs j = 0..n-1 (rows (j0 + j) * ROWS .. of ROWS rows,
// BOXES boxes of 64 columns each: the first of the pair from columns col_a of map_a into sA,
// completing k_full, the second from col_b of map_b into sB, completing v_full; batch b):
// pair j goes to stage j & 1 once the consumers have released the stage's previous pair
// (kv_empty, phase j/2 - 1). K_j, V_j in the forward and dQ kernels; Q_i, dO_i in dK/dV.
template <int BOXES, int ROWS>
__device__ __forceinline__ void produce_pairs(const KvBars& bars, const ptx::TmaMap& map_a,
                                              const ptx::TmaMap& map_b, uint32_t sA, uint32_t sB,
                                              int col_a, int col_b, int b, int j0, int n) {
  constexpr uint32_t kTile = BOXES * kBoxBytes<ROWS>;
  for (int j = 0; j < n; ++j) {
    const int s = j & 1, row = (j0 + j) * ROWS;
    if (j >= 2) ptx::mbar_wait(bars.kv_empty(s), ((j >> 1) - 1) & 1);
    ptx::mbar_arrive_expect_tx(bars.k_full(s), kTile);
    for (int a = 0; a < BOXES; ++a)
      ptx::tma_load_3d(sA + s * kTile + a * kBoxBytes<ROWS>, map_a, col_a + a * 64, row, b,
                       bars.k_full(s));
    ptx::mbar_arrive_expect_tx(bars.v_full(s), kTile);
    for (int a = 0; a < BOXES; ++a)
      ptx::tma_load_3d(sB + s * kTile + a * kBoxBytes<ROWS>, map_b, col_b + a * 64, row, b,
                       bars.v_full(s));
  }
}

// A 3-D tensor map over a (B, T, W) row-major tensor of 16-bit elements (W columns), boxes of
// 64 columns x `rows` rows, 128-byte swizzle; coordinates (column, t, b).
inline ptx::TmaMap tma_rows(const void* base, int64_t W, int T, int B, int rows) {
  const uint64_t dims[3] = {static_cast<uint64_t>(W), static_cast<uint64_t>(T),
                            static_cast<uint64_t>(B)};
  const uint64_t strides[2] = {static_cast<uint64_t>(W) * 2, static_cast<uint64_t>(W) * 2 * T};
  const uint32_t box[3] = {64, static_cast<uint32_t>(rows), 1};
  return ptx::make_tma_3d(base, dims, strides, box, 128);
}

}  // namespace st::flash::sm90
