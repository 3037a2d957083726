// The SIMT emulator itself (label emu): each emulated PTX instruction alone against the PTX
// ISA's definition on integer-valued inputs (exact, so any layout error shows), the warp
// collectives, and every check the emulator promises (races, bounds, uninitialised reads,
// deadlocks, launch limits) on small kernels written here to break each rule once.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"
#include "simt/simt.h"

namespace {

using st::cudak::launch;

// Runs a launch and returns "" on success, else the emulator's error text.
template <class F>
std::string run(F&& f) {
  f();
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

uint16_t bf16_bits(float x) {  // exact for the small integers used here
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>(u >> 16);
}
uint16_t f16_bits(float x) {  // small integers: exact
  return __half_as_ushort(__float2half_rn(x));
}

// ---------------------------------------------------------------- ldmatrix

// smem tile 32 rows x 8 halves (16 bytes per row); value at [r][c] = r * 8 + c + 1.
// Lane l gives the address of row perm(l) so that address routing is checked too.
__device__ int ldm_row_of_lane(int l) {
  return (l * 5 + 3) % 32;  // a permutation of 0..31
}
template <int NUM, bool TRANS>
__global__ void ldmatrix_kernel(uint32_t* out) {
  ST_SHARED(uint16_t, tile, [32 * 8]);
  const int l = threadIdx.x;
  for (int c = 0; c < 8; ++c) tile[l * 8 + c] = static_cast<uint16_t>(l * 8 + c + 1);
  __syncthreads();
  const uint32_t addr = st::ptx::smem_addr(&tile[ldm_row_of_lane(l) * 8]);
  uint32_t r[4] = {0, 0, 0, 0};
  if constexpr (NUM == 1) {
    uint32_t x[1];
    TRANS ? st::ptx::ldmatrix_x1_trans(x, addr) : st::ptx::ldmatrix_x1(x, addr);
    r[0] = x[0];
  } else if constexpr (NUM == 2) {
    uint32_t x[2];
    TRANS ? st::ptx::ldmatrix_x2_trans(x, addr) : st::ptx::ldmatrix_x2(x, addr);
    r[0] = x[0], r[1] = x[1];
  } else {
    TRANS ? st::ptx::ldmatrix_x4_trans(r, addr) : st::ptx::ldmatrix_x4(r, addr);
  }
  for (int i = 0; i < 4; ++i) out[l * 4 + i] = r[i];
}

template <int NUM, bool TRANS>
void check_ldmatrix() {
  std::vector<uint32_t> out(32 * 4, 0xdeadbeef);
  ASSERT_EQ(run([&] { launch(ldmatrix_kernel<NUM, TRANS>, 1, 32, 0, nullptr, out.data()); }), "");
  // PTX ISA: matrix i's row r is at the address given by lane 8i + r; lane l receives
  // element [l/4][2(l%4) .. +1] of each matrix (with .trans: [2(l%4) .. +1][l/4]).
  auto elem = [&](int i, int row, int col) {
    const int tile_row = ldm_row_of_lane(8 * i + row);
    return static_cast<uint32_t>(tile_row * 8 + col + 1);
  };
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) {
      uint32_t want = 0;
      if (i < NUM) {
        const int g = l / 4, c = l % 4;
        const uint32_t lo = TRANS ? elem(i, 2 * c, g) : elem(i, g, 2 * c);
        const uint32_t hi = TRANS ? elem(i, 2 * c + 1, g) : elem(i, g, 2 * c + 1);
        want = lo | (hi << 16);
      }
      EXPECT_EQ(out[l * 4 + i], want) << "lane " << l << " register " << i;
    }
  }
}

TEST(SimtPtx, LdmatrixX1) {
  check_ldmatrix<1, false>();
}
TEST(SimtPtx, LdmatrixX2) {
  check_ldmatrix<2, false>();
}
TEST(SimtPtx, LdmatrixX4) {
  check_ldmatrix<4, false>();
}
TEST(SimtPtx, LdmatrixX1Trans) {
  check_ldmatrix<1, true>();
}
TEST(SimtPtx, LdmatrixX2Trans) {
  check_ldmatrix<2, true>();
}
TEST(SimtPtx, LdmatrixX4Trans) {
  check_ldmatrix<4, true>();
}

// ---------------------------------------------------------------- mma.sync m16n8k16

// Fragments packed in global memory by the host, per lane, exactly as the PTX ISA's
// figures for mma.m16n8k16 with .bf16/.f16 (see the packing below); D unpacked the same way.
template <class T>
__global__ void mma_kernel(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  const int l = threadIdx.x;
  uint32_t af[4];
  for (int i = 0; i < 4; ++i) af[i] = a[l * 4 + i];
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[l * 4 + i];
  st::ptx::mma_16816<T>(acc, af, b[l * 2], b[l * 2 + 1]);
  for (int i = 0; i < 4; ++i) d[l * 4 + i] = acc[i];
}

template <class T>
void check_mma(uint16_t (*bits)(float)) {
  // A (16 x 16), B (16 x 8), C (16 x 8): integers small enough that every product and sum
  // is exact in FP32 whatever the order, so the result must equal the naive product.
  float A[16][16], B[16][8], C[16][8];
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) A[i][k] = static_cast<float>((i * 7 + k * 3) % 17 - 8);
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < 8; ++j) B[k][j] = static_cast<float>((k * 5 + j * 11) % 13 - 6);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) C[i][j] = static_cast<float>(i * 8 + j - 50);
  std::vector<uint32_t> a(32 * 4), b(32 * 2);
  std::vector<float> c(32 * 4), d(32 * 4, -1.0f);
  auto pack = [&](float lo, float hi) {
    return static_cast<uint32_t>(bits(lo)) | (static_cast<uint32_t>(bits(hi)) << 16);
  };
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;  // groupID, threadID_in_group
    // A: a0,a1 row g cols 2t,2t+1; a2,a3 row g+8; a4,a5 row g cols +8; a6,a7 row g+8 cols +8
    a[l * 4 + 0] = pack(A[g][2 * t], A[g][2 * t + 1]);
    a[l * 4 + 1] = pack(A[g + 8][2 * t], A[g + 8][2 * t + 1]);
    a[l * 4 + 2] = pack(A[g][2 * t + 8], A[g][2 * t + 9]);
    a[l * 4 + 3] = pack(A[g + 8][2 * t + 8], A[g + 8][2 * t + 9]);
    // B: b0,b1 rows (k) 2t,2t+1 col g; b2,b3 rows 2t+8, 2t+9
    b[l * 2 + 0] = pack(B[2 * t][g], B[2 * t + 1][g]);
    b[l * 2 + 1] = pack(B[2 * t + 8][g], B[2 * t + 9][g]);
    // C/D: c0,c1 row g cols 2t,2t+1; c2,c3 row g+8
    c[l * 4 + 0] = C[g][2 * t];
    c[l * 4 + 1] = C[g][2 * t + 1];
    c[l * 4 + 2] = C[g + 8][2 * t];
    c[l * 4 + 3] = C[g + 8][2 * t + 1];
  }
  ASSERT_EQ(run([&] {
              launch(mma_kernel<T>, 1, 32, 0, nullptr, a.data(), b.data(), c.data(), d.data());
            }),
            "");
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int e = 0; e < 4; ++e) {
      double want = C[rows[e]][cols[e]];
      for (int k = 0; k < 16; ++k) want += double{A[rows[e]][k]} * B[k][cols[e]];
      EXPECT_EQ(d[l * 4 + e], static_cast<float>(want)) << "lane " << l << " element " << e;
    }
  }
}

TEST(SimtPtx, MmaBf16MatchesNaiveProduct) {
  check_mma<__nv_bfloat16>(bf16_bits);
}
TEST(SimtPtx, MmaF16MatchesNaiveProduct) {
  check_mma<__half>(f16_bits);
}

// ldmatrix feeding mma as the flash kernels do: A (16 x 16) and X (8 x 16, so B = X^T)
// row-major in shared memory, fragments by ldmatrix.x4 / .x2, product by mma: S = A X^T.
// And the .trans path: B (16 x 8) row-major (k rows), B fragments by ldmatrix.x2.trans.
__global__ void ldm_mma_kernel(const uint16_t* A, const uint16_t* X, const uint16_t* Bk, float* S,
                               float* O) {
  ST_SHARED(uint16_t, sa, [16 * 16]);
  ST_SHARED(uint16_t, sx, [8 * 16]);
  ST_SHARED(uint16_t, sb, [16 * 8]);
  const int l = threadIdx.x;
  for (int i = l; i < 256; i += 32) sa[i] = A[i];
  for (int i = l; i < 128; i += 32) sx[i] = X[i], sb[i] = Bk[i];
  __syncthreads();
  uint32_t a[4], b[2], bt[2];
  // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
  st::ptx::ldmatrix_x4(a, st::ptx::smem_addr(&sa[((l & 15) * 16) + ((l >> 4) << 3)]));
  // B = X^T: matrices (n rows of X 0-7, k 0-7), (n 0-7, k 8-15)
  st::ptx::ldmatrix_x2(b, st::ptx::smem_addr(&sx[(l & 7) * 16 + (((l >> 3) & 1) << 3)]));
  // B stored k-major (16 rows of 8): matrices (k 0-7), (k 8-15), transposed
  st::ptx::ldmatrix_x2_trans(bt, st::ptx::smem_addr(&sb[(l & 15) * 8]));
  float s[4] = {0, 0, 0, 0}, o[4] = {0, 0, 0, 0};
  st::ptx::mma_16816<__nv_bfloat16>(s, a, b[0], b[1]);
  st::ptx::mma_16816<__nv_bfloat16>(o, a, bt[0], bt[1]);
  const int g = l / 4, t = l % 4;
  S[g * 8 + 2 * t] = s[0], S[g * 8 + 2 * t + 1] = s[1];
  S[(g + 8) * 8 + 2 * t] = s[2], S[(g + 8) * 8 + 2 * t + 1] = s[3];
  O[g * 8 + 2 * t] = o[0], O[g * 8 + 2 * t + 1] = o[1];
  O[(g + 8) * 8 + 2 * t] = o[2], O[(g + 8) * 8 + 2 * t + 1] = o[3];
}

TEST(SimtPtx, LdmatrixFragmentsFeedMma) {
  std::vector<uint16_t> A(256), X(128), Bk(128);
  std::vector<float> Af(256), Xf(128), Bf(128);
  for (int i = 0; i < 256; ++i)
    Af[i] = static_cast<float>((i * 37) % 15 - 7), A[i] = bf16_bits(Af[i]);
  for (int i = 0; i < 128; ++i)
    Xf[i] = static_cast<float>((i * 11) % 9 - 4), X[i] = bf16_bits(Xf[i]);
  for (int i = 0; i < 128; ++i)
    Bf[i] = static_cast<float>((i * 13) % 7 - 3), Bk[i] = bf16_bits(Bf[i]);
  std::vector<float> S(128, -1), O(128, -1);
  ASSERT_EQ(run([&] {
              launch(ldm_mma_kernel, 1, 32, 0, nullptr, A.data(), X.data(), Bk.data(), S.data(),
                     O.data());
            }),
            "");
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      double s = 0, o = 0;
      for (int k = 0; k < 16; ++k) s += double{Af[i * 16 + k]} * Xf[j * 16 + k];
      for (int k = 0; k < 16; ++k) o += double{Af[i * 16 + k]} * Bf[k * 8 + j];
      EXPECT_EQ(S[i * 8 + j], s) << "S " << i << "," << j;
      EXPECT_EQ(O[i * 8 + j], o) << "O " << i << "," << j;
    }
  }
}

// ---------------------------------------------------------------- cp.async

// 32 threads copy 16 bytes each (even lanes valid, odd lanes zero-filled) in group 1, and
// 4 bytes each in group 2; after wait_group 1 only group 1 must have landed.
__global__ void cp_async_kernel(const uint32_t* src, uint32_t* out) {
  ST_SHARED(uint32_t, s16, [32 * 4]);
  ST_SHARED(uint32_t, s4, [32]);
  const int l = threadIdx.x;
  s4[l] = 0xfeedu;  // to be overwritten by group 2, not before its wait
  __syncthreads();
  st::ptx::cp_async_16(st::ptx::smem_addr(&s16[l * 4]), src + l * 4, (l % 2) == 0);
  st::ptx::cp_async_commit();
  st::ptx::cp_async_4(st::ptx::smem_addr(&s4[l]), src + 128 + l, true);
  st::ptx::cp_async_commit();
  st::ptx::cp_async_wait<1>();
  for (int i = 0; i < 4; ++i) out[l * 4 + i] = s16[l * 4 + i];
  out[128 + l] = s4[l];  // group 2 still in flight: the old value under the emulator
  st::ptx::cp_async_wait<0>();
  out[160 + l] = s4[l];
}

TEST(SimtPtx, CpAsyncZeroFillAndWaitGroups) {
  std::vector<uint32_t> src(160), out(192, 0);
  for (int i = 0; i < 160; ++i) src[i] = 1000u + static_cast<uint32_t>(i);
  ASSERT_EQ(run([&] { launch(cp_async_kernel, 1, 32, 0, nullptr, src.data(), out.data()); }), "");
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[l * 4 + i], l % 2 == 0 ? src[l * 4 + i] : 0u);
    EXPECT_EQ(out[128 + l], 0xfeedu) << "wait_group 1 completed the newest group";
    EXPECT_EQ(out[160 + l], src[128 + l]);
  }
}

__global__ void cp_async_misaligned_kernel(const uint32_t* src) {
  ST_SHARED(uint32_t, s, [64]);
  st::ptx::cp_async_16(st::ptx::smem_addr(&s[1]), src, true);  // 4-byte aligned only
  st::ptx::cp_async_commit();
  st::ptx::cp_async_wait<0>();
}

TEST(SimtPtx, CpAsyncMisalignedFails) {
  std::vector<uint32_t> src(64);
  EXPECT_NE(run([&] {
              launch(cp_async_misaligned_kernel, 1, 32, 0, nullptr, src.data());
            }).find("not aligned"),
            std::string::npos);
}

// ---------------------------------------------------------------- warp collectives

__global__ void shfl_kernel(int* out, int width) {
  const int l = threadIdx.x % 32, w = threadIdx.x / 32;
  int* o = out + (w * 32 + l) * 8;
  o[0] = __shfl_xor_sync(0xffffffffu, l * 10, 5, width);
  o[1] = __shfl_up_sync(0xffffffffu, l * 10, 3, width);
  o[2] = __shfl_down_sync(0xffffffffu, l * 10, 3, width);
  o[3] = __shfl_sync(0xffffffffu, l * 10, 7, width);
  o[4] = static_cast<int>(__ballot_sync(0xffffffffu, l % 3 == 0));
  o[5] = __any_sync(0xffffffffu, l == 17);
  o[6] = __all_sync(0xffffffffu, l < 31);
  o[7] = static_cast<int>(__shfl_xor_sync(0xffffffffu, 1.5 * l, 1));  // 8-byte value
}

TEST(SimtWarp, ShuffleAndVoteSemantics) {
  for (int width : {32, 8}) {
    std::vector<int> out(64 * 8, -1);
    ASSERT_EQ(run([&] { launch(shfl_kernel, 1, 64, 0, nullptr, out.data(), width); }), "");
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l)
      if (l % 3 == 0) ballot |= 1u << l;
    for (int t = 0; t < 64; ++t) {
      const int l = t % 32, seg = l / width * width;
      const int* o = &out[t * 8];
      const int x = l ^ 5;
      EXPECT_EQ(o[0], (x >= seg && x < seg + width ? x : l) * 10) << "xor lane " << l;
      EXPECT_EQ(o[1], (l - 3 >= seg ? l - 3 : l) * 10) << "up lane " << l;
      EXPECT_EQ(o[2], (l + 3 < seg + width ? l + 3 : l) * 10) << "down lane " << l;
      EXPECT_EQ(o[3], (seg + 7 % width) * 10) << "idx lane " << l;
      EXPECT_EQ(static_cast<unsigned>(o[4]), ballot);
      EXPECT_EQ(o[5], 1);
      EXPECT_EQ(o[6], 0);
      EXPECT_EQ(o[7], static_cast<int>(1.5 * (l ^ 1)));
    }
  }
}

__global__ void syncthreads_or_kernel(int* out) {
  const int t = threadIdx.x;
  out[t] = __syncthreads_or(t == 77);
  out[128 + t] = __syncthreads_count(t % 4 == 0);
  out[256 + t] = __syncthreads_and(t < 200);
}

TEST(SimtWarp, BlockVotes) {
  std::vector<int> out(384, -1);
  ASSERT_EQ(run([&] { launch(syncthreads_or_kernel, 1, 128, 0, nullptr, out.data()); }), "");
  for (int t = 0; t < 128; ++t) {
    EXPECT_EQ(out[t], 1);
    EXPECT_EQ(out[128 + t], 32);
    EXPECT_EQ(out[256 + t], 1);
  }
}

// ---------------------------------------------------------------- the checks

__global__ void race_kernel(int* out, bool barrier, bool warp_barrier_only, int reader) {
  ST_SHARED(int, s, [64]);
  const int t = threadIdx.x;
  if (t == 0) s[0] = 42;
  if (barrier) __syncthreads();
  if (warp_barrier_only) __syncwarp();
  if (t == reader) out[0] = s[0];
}

TEST(SimtChecks, SharedRaceIsFlagged) {
  int out = 0;
  EXPECT_NE(
      run([&] { launch(race_kernel, 1, 64, 0, nullptr, &out, false, false, 1); }).find("race"),
      std::string::npos);
  // Ordered by __syncthreads: fine.
  EXPECT_EQ(run([&] { launch(race_kernel, 1, 64, 0, nullptr, &out, true, false, 1); }), "");
  EXPECT_EQ(out, 42);
  // __syncwarp orders lanes of one warp, not threads of two warps.
  EXPECT_EQ(run([&] { launch(race_kernel, 1, 64, 0, nullptr, &out, false, true, 1); }), "");
  EXPECT_NE(
      run([&] { launch(race_kernel, 1, 64, 0, nullptr, &out, false, true, 33); }).find("race"),
      std::string::npos);
}

__global__ void war_race_kernel(int* out) {
  ST_SHARED(int, s, [32]);
  const int t = threadIdx.x;
  s[t] = t;
  __syncthreads();
  const int v = s[(t + 1) % 32];  // read a neighbour's word ...
  s[t] = v * 2;                   // ... which the neighbour overwrites: no barrier between
  out[t] = v;
}

TEST(SimtChecks, WriteAfterReadRaceIsFlagged) {
  std::vector<int> out(32);
  EXPECT_NE(run([&] { launch(war_race_kernel, 1, 32, 0, nullptr, out.data()); }).find("race"),
            std::string::npos);
}

__global__ void oob_kernel(int* out, int index, bool dynamic) {
  ST_SHARED(int, s, [32]);
  ST_SHARED_DYNAMIC(int, d, 16);
  if (threadIdx.x == 0) {
    if (dynamic) {
      d[index] = 1;
    } else {
      s[index] = 1;
    }
  }
  __syncthreads();
  out[threadIdx.x] = 0;
}

TEST(SimtChecks, SharedOutOfBoundsIsFlagged) {
  std::vector<int> out(32);
  EXPECT_EQ(run([&] { launch(oob_kernel, 1, 32, 64, nullptr, out.data(), 31, false); }), "");
  EXPECT_NE(run([&] {
              launch(oob_kernel, 1, 32, 64, nullptr, out.data(), 32, false);
            }).find("out of bounds"),
            std::string::npos);
  EXPECT_EQ(run([&] { launch(oob_kernel, 1, 32, 64, nullptr, out.data(), 15, true); }), "");
  EXPECT_NE(run([&] {
              launch(oob_kernel, 1, 32, 64, nullptr, out.data(), 16, true);
            }).find("out of bounds"),
            std::string::npos);
  EXPECT_NE(run([&] {
              launch(oob_kernel, 1, 32, 64, nullptr, out.data(), -1, true);
            }).find("out of bounds"),
            std::string::npos);
}

__global__ void uninit_kernel(int* out) {
  ST_SHARED(int, s, [32]);
  if (threadIdx.x < 31) s[threadIdx.x] = 1;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % 32];  // s[31] was never written
}

TEST(SimtChecks, UninitialisedSharedReadIsFlagged) {
  std::vector<int> out(32);
  EXPECT_NE(run([&] { launch(uninit_kernel, 1, 32, 0, nullptr, out.data()); }).find("no thread"),
            std::string::npos);
}

__global__ void divergent_kernel(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x < 16) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);  // names lanes 16..31, which never come
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = v;
}

TEST(SimtChecks, DivergentCollectivesDeadlock) {
  std::vector<int> out(32);
  const std::string e = run([&] { launch(divergent_kernel, 1, 32, 0, nullptr, out.data()); });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
}

__global__ void exit_kernel(int* out, unsigned gone) {
  if (threadIdx.x == gone) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

// Both orders: lane 0 exits before the others arrive (caught on arrival), lane 31 after they
// wait (caught on its exit).
TEST(SimtChecks, CollectiveWaitingForAnExitedLaneFails) {
  std::vector<int> out(32);
  for (unsigned gone : {0u, 3u, 31u}) {
    const std::string e = run([&] { launch(exit_kernel, 1, 32, 0, nullptr, out.data(), gone); });
    EXPECT_NE(e.find("exited"), std::string::npos) << "lane " << gone << ": " << e;
  }
}

__global__ void mismatch_kernel(int* out, unsigned odd) {
  int v = threadIdx.x;
  if (threadIdx.x == odd) {
    v = __ballot_sync(0xffffffffu, 1);
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

// Lanes 0..15 wait for the whole warp; lane 16 then arrives with the upper half only.
__global__ void mask_mismatch_kernel(int* out) {
  __syncwarp(threadIdx.x < 16 ? 0xffffffffu : 0xffff0000u);
  out[threadIdx.x] = 1;
}

TEST(SimtChecks, DifferentCollectivesInOneWarpFail) {
  std::vector<int> out(32);
  for (unsigned odd : {0u, 17u, 31u}) {
    const std::string e = run([&] { launch(mismatch_kernel, 1, 32, 0, nullptr, out.data(), odd); });
    EXPECT_NE(e.find("lane arrives at"), std::string::npos) << "lane " << odd << ": " << e;
  }
  const std::string e = run([&] { launch(mask_mismatch_kernel, 1, 32, 0, nullptr, out.data()); });
  EXPECT_NE(e.find("lane arrives at __syncwarp (mask 4294901760) while lane 0 waits at __syncwarp "
                   "(mask 4294967295)"),
            std::string::npos)
      << e;
}

__global__ void smem_kernel(int* out) {
  ST_SHARED(int, s, [128]);  // 512 bytes of static shared memory
  ST_SHARED_DYNAMIC(int, d, 16);
  s[threadIdx.x] = 1;
  d[threadIdx.x] = 2;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x] + d[threadIdx.x];
}
__global__ void smem_optin_kernel(int* out) {
  ST_SHARED(int, s, [128]);
  ST_SHARED_DYNAMIC(int, d, 16);
  s[threadIdx.x] = 1;
  d[threadIdx.x] = 2;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x] + d[threadIdx.x];
}

TEST(SimtChecks, SharedMemoryLimitsAsTheDriver) {
  std::vector<int> out(32);
  // without opting in: static + dynamic <= 48 KB
  EXPECT_EQ(run([&] { launch(smem_kernel, 1, 32, 48 * 1024 - 512, nullptr, out.data()); }), "");
  EXPECT_EQ(out[5], 3);
  EXPECT_NE(
      run([&] { launch(smem_kernel, 1, 32, 48 * 1024 - 508, nullptr, out.data()); }).find("48 KB"),
      std::string::npos);
  EXPECT_NE(run([&] {
              launch(smem_kernel, 1, 32, 48 * 1024 + 4, nullptr, out.data());
            }).find("without cudaFuncSetAttribute"),
            std::string::npos);
  // opted in to 100 KB: up to 100 KB dynamic; over the attribute fails; 227 KB is the cap
  ASSERT_EQ(cudaFuncSetAttribute(smem_optin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 100 * 1024),
            cudaSuccess);
  EXPECT_EQ(run([&] { launch(smem_optin_kernel, 1, 32, 100 * 1024, nullptr, out.data()); }), "");
  EXPECT_NE(run([&] { launch(smem_optin_kernel, 1, 32, 100 * 1024 + 4, nullptr, out.data()); }),
            "");
  EXPECT_NE(cudaFuncSetAttribute(smem_optin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 227 * 1024 + 4),
            cudaSuccess);
  ASSERT_EQ(cudaFuncSetAttribute(smem_optin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 227 * 1024),
            cudaSuccess);
  EXPECT_NE(run([&] {
              launch(smem_optin_kernel, 1, 32, 227 * 1024, nullptr, out.data());
            }).find("232448"),
            std::string::npos);  // + 512 static bytes
  EXPECT_EQ(run([&] { launch(smem_optin_kernel, 1, 32, 227 * 1024 - 512, nullptr, out.data()); }),
            "");
}

TEST(SimtChecks, InvalidLaunchConfigurations) {
  std::vector<int> out(2048);
  EXPECT_NE(run([&] { launch(smem_kernel, 1, 1025, 0, nullptr, out.data()); }), "");
  EXPECT_NE(run([&] { launch(smem_kernel, dim3(1, 65536), 32, 0, nullptr, out.data()); }), "");
}

// ---------------------------------------------------------------- schedules

// Each thread appends its id to a global log at a global cursor (not shared memory: not
// race-checked): the log is the order in which threads passed the point.
__global__ void order_kernel(int* log, int* cursor) {
  log[(*cursor)++] = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  __syncthreads();
  log[(*cursor)++] = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
}

TEST(SimtSchedule, SeedsGiveDifferentInterleavingsAndBlockOrders) {
  auto order = [](uint64_t seed) {
    simt::options().schedule_seed = seed;
    std::vector<int> log(4 * 64 * 2, -1);
    int cursor = 0;
    launch(order_kernel, 4, 64, 0, nullptr, log.data(), &cursor);
    simt::options().schedule_seed = 0;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cursor, 512);
    return log;
  };
  const std::vector<int> a = order(0), b = order(1), c = order(2), b2 = order(1);
  std::vector<int> in_order;
  for (int blk = 0; blk < 4; ++blk)
    for (int pass = 0; pass < 2; ++pass)
      for (int t = 0; t < 64; ++t) in_order.push_back(blk * 64 + t);
  EXPECT_EQ(a, in_order);  // seed 0: blocks and threads in order
  EXPECT_NE(b, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(b, b2);  // a seed is one fixed schedule
  std::multiset<int> sb(b.begin(), b.end()), sa(a.begin(), a.end());
  EXPECT_EQ(sb, sa);
}

TEST(SimtSchedule, LaunchesAreCounted) {
  const uint64_t before = simt::stats().launches;
  std::vector<int> out(32);
  launch(smem_kernel, 1, 32, 128, nullptr, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(simt::stats().launches, before + 1);
}

}  // namespace
