// The SIMT emulator's Hopper instructions (label emu), each against the PTX ISA's definition
// on hand-worked cases: wgmma's shared-memory matrix descriptors (every swizzle, K-major and
// MN-major), wgmma.mma_async with A from shared memory and from registers (integer-valued
// operands: exact, so any layout error shows), TMA tensor copies (swizzle, out-of-bounds
// fill), mbarrier phases and transaction counts, named barriers, setmaxnreg; and each check
// the emulator promises for them, on small kernels written here to break one rule each.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"
#include "simt/simt.h"

namespace {

using st::cudak::launch;
namespace ptx = st::ptx;

template <class F>
std::string run(F&& f) {
  f();
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}
bool has(const std::string& s, const char* what) {
  return s.find(what) != std::string::npos;
}

uint16_t bf16_of(int v) {  // small integers: exact in bf16
  const float x = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>(u >> 16);
}
int int_of_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return static_cast<int>(x);
}

// ---------------------------------------------------------------- descriptors

// Addresses worked by hand from the PTX ISA's canonical layouts (see the comments: row,
// 16-byte chunk, and the 128-byte swizzle's chunk XOR row-in-atom).
TEST(SimtHopper, DescriptorAddressesByHand) {
  // K-major, 128-byte swizzle, start 1024, SBO 1024: element (row 3, k 9) sits in row 3
  // (byte 384 of the atom), bytes 18-19 of it = chunk 1, byte 2; chunk 1 XOR row 3 = chunk 2:
  // 1024 + 384 + 32 + 2.
  const uint64_t k128 = ptx::wgmma_desc(1024, 16, 1024, 128);
  EXPECT_EQ(simt::wgmma_desc_address(k128, false, 3, 9), 1024u + 384 + 32 + 2);
  // row 11: the second 8-row group (SBO 1024 on), row 3 in it: the same swizzle.
  EXPECT_EQ(simt::wgmma_desc_address(k128, false, 11, 9), 2048u + 384 + 32 + 2);
  // row 0 is not swizzled; k 15 = chunk 1, byte 14.
  EXPECT_EQ(simt::wgmma_desc_address(k128, false, 0, 15), 1024u + 16 + 14);
  // A start 32 bytes into the row (the next K = 16 step): row 5, k 0 is byte 32 = chunk 2;
  // 2 XOR 5 = chunk 7.
  const uint64_t k128b = ptx::wgmma_desc(1024 + 32, 16, 1024, 128);
  EXPECT_EQ(simt::wgmma_desc_address(k128b, false, 5, 0), 1024u + 5 * 128 + 7 * 16);

  // K-major, no swizzle (core matrices of 8 rows x 16 bytes): start 512, LBO 128 (next 8 of
  // K), SBO 256 (next 8 rows). (row 9, k 10): row 1 of group 1, K chunk 1, element 2:
  // 512 + 16 + 256 + 128 + 4.
  const uint64_t k0 = ptx::wgmma_desc(512, 128, 256, 0);
  EXPECT_EQ(simt::wgmma_desc_address(k0, false, 9, 10), 512u + 16 + 256 + 128 + 4);

  // MN-major, 128-byte swizzle: rows are K indices of 64 contiguous MN elements; start 2048,
  // LBO 16384 (next 64 of MN), SBO 1024 (next 8 of K). (mn 70, k 11): MN atom 1, column 6
  // (byte 12, chunk 0); K group 1, row 3 in it; chunk 0 XOR 3 = 3:
  // 2048 + 16384 + 1024 + 384 + 48 + 12.
  const uint64_t mn128 = ptx::wgmma_desc(2048, 16384, 1024, 128);
  EXPECT_EQ(simt::wgmma_desc_address(mn128, true, 70, 11), 2048u + 16384 + 1024 + 384 + 48 + 12);

  // MN-major, no swizzle: core matrices of 8 K rows x 8 MN elements; SBO steps MN by 8,
  // LBO steps K by 8. start 0, LBO 512, SBO 128: (mn 13, k 9): MN group 1 (+128), element 5
  // (+10); K group 1 (+512), row 1 (+16).
  const uint64_t mn0 = ptx::wgmma_desc(0, 512, 128, 0);
  EXPECT_EQ(simt::wgmma_desc_address(mn0, true, 13, 9), 128u + 10 + 512 + 16);

  // 64- and 32-byte swizzles, K-major: rows of 64 (32) bytes, chunk XOR (row / 2) (row / 4)
  // over 2 (1) bits. 64B: start 0, row 6, k 4 -> byte 6*64 + 8 = 392 = chunk 0 of row-pair 3;
  // chunk 0 XOR 3 = 3: 384 + 48 + 8.
  EXPECT_EQ(simt::wgmma_desc_address(ptx::wgmma_desc(0, 16, 512, 64), false, 6, 4), 384u + 48 + 8);
  // 32B: row 5, k 9 -> byte 5*32 + 18 = 178: chunk 1 (bits 4) XOR bit 7 (1) = 0: 160 + 2.
  EXPECT_EQ(simt::wgmma_desc_address(ptx::wgmma_desc(0, 16, 256, 32), false, 5, 9), 160u + 2);
}

// ---------------------------------------------------------------- wgmma

// Element (r, c) of an integer test matrix, small enough for every product sum to be exact.
int aval(int r, int k) {
  return ((r * 7 + k * 3) % 9) - 4;
}
int bval(int k, int n) {
  return ((k * 5 + n * 11) % 7) - 3;
}
int cval(int r, int n) {
  return (r * 3 + n) % 5 - 2;
}

constexpr int kN = 24;  // wgmma N: three 8-column blocks

// A (64 x 16) and B^T (24 rows of N x 16 of K) K-major with the 128-byte swizzle, written by
// the threads at the swizzled addresses (the test's own formula: chunk XOR row % 8), then
// D = A B (+ C) with A from the descriptor (SS) or from registers built from A (RS); the
// second form takes B MN-major (K rows of N elements, no swizzle, LBO/SBO as the ISA says).
template <bool RS, bool SCALE_D>
__global__ void wgmma_kernel(float* out) {
  ST_SHARED_DYNAMIC(unsigned char, raw, 128);
  const uint32_t base = (ptx::smem_addr(raw) + 1023u) & ~1023u;
  unsigned char* mem = raw + (base - ptx::smem_addr(raw));
  const uint32_t sA = base, sB = base + 8192;
  const int t = threadIdx.x;
  auto put = [&](uint32_t addr, int v) {  // a plain store: the race hooks see it
    *reinterpret_cast<uint16_t*>(mem + (addr - base)) = bf16_of(v);
  };
  auto swz = [](uint32_t row_start, int byte) {  // byte within a 128-byte row of the atom
    const int row = static_cast<int>((row_start >> 7) & 7);
    return row_start + static_cast<uint32_t>((((byte >> 4) ^ row) << 4) | (byte & 15));
  };
  for (int i = t; i < 64 * 16; i += 128) {
    const int r = i / 16, k = i % 16;
    put(swz(sA + static_cast<uint32_t>(r) * 128, 2 * k), aval(r, k));
  }
  if (!RS) {
    for (int i = t; i < kN * 16; i += 128) {
      const int n = i / 16, k = i % 16;
      put(swz(sB + static_cast<uint32_t>(n) * 128, 2 * k), bval(k, n));
    }
  } else {
    // MN-major, interleave: core matrix (8 K rows x 8 N) at (n / 8) * SBO + (k / 8) * LBO,
    // K row (k % 8) 16 bytes apart; SBO 128, LBO 128 * (kN / 8).
    for (int i = t; i < kN * 16; i += 128) {
      const int n = i / 16, k = i % 16;
      put(sB + static_cast<uint32_t>((n / 8) * 128 + (k / 8) * 128 * (kN / 8) + (k % 8) * 16 +
                                     (n % 8) * 2),
          bval(k, n));
    }
  }
  __syncthreads();
  const int warp = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;
  float d[kN / 2];
  for (int idx = 0; idx < kN / 2; ++idx) {
    const int j = idx / 4, e = idx % 4;
    d[idx] = static_cast<float>(cval(16 * warp + g + (e >= 2 ? 8 : 0), 8 * j + 2 * c + (e & 1)));
  }
  ptx::wgmma_fence();
  if constexpr (RS) {
    uint32_t a[4];
    const int r0 = 16 * warp + g;
    const int rr[4] = {r0, r0 + 8, r0, r0 + 8}, kk[4] = {2 * c, 2 * c, 2 * c + 8, 2 * c + 8};
    for (int i = 0; i < 4; ++i)
      a[i] = static_cast<uint32_t>(bf16_of(aval(rr[i], kk[i]))) |
             (static_cast<uint32_t>(bf16_of(aval(rr[i], kk[i] + 1))) << 16);
    ::simt::wgmma(d, kN, a, 0, ptx::wgmma_desc(sB, 128 * (kN / 8), 128, 0), SCALE_D, 0, 1, true);
  } else {
    ::simt::wgmma(d, kN, nullptr, ptx::wgmma_desc(sA, 16, 1024, 128),
                  ptx::wgmma_desc(sB, 16, 1024, 128), SCALE_D, 0, 0, true);
  }
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  for (int idx = 0; idx < kN / 2; ++idx) {
    const int j = idx / 4, e = idx % 4;
    out[(16 * warp + g + (e >= 2 ? 8 : 0)) * kN + 8 * j + 2 * c + (e & 1)] = d[idx];
  }
}

template <bool RS, bool SCALE_D>
void check_wgmma() {
  std::vector<float> out(64 * kN, -999.f);
  auto k = wgmma_kernel<RS, SCALE_D>;
  ASSERT_EQ(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 20000),
            cudaSuccess);
  ASSERT_EQ(run([&] { launch(k, 1, 128, 20000, nullptr, out.data()); }), "");
  for (int r = 0; r < 64; ++r)
    for (int n = 0; n < kN; ++n) {
      int want = SCALE_D ? cval(r, n) : 0;
      for (int kk = 0; kk < 16; ++kk) want += aval(r, kk) * bval(kk, n);
      ASSERT_EQ(out[r * kN + n], static_cast<float>(want)) << "D[" << r << "][" << n << "]";
    }
}

TEST(SimtHopper, WgmmaSharedOperandsKMajorSwizzled) {
  check_wgmma<false, true>();
  check_wgmma<false, false>();
}
TEST(SimtHopper, WgmmaRegisterAMnMajorB) {
  check_wgmma<true, true>();
  check_wgmma<true, false>();
}

// A wgmma issued by one warp of a warpgroup only, its accumulators or its register A touched
// in flight, a warp leaving with a wgmma unretired: each fails the launch.
__global__ void wgmma_misuse_kernel(int mode) {
  ST_SHARED(uint16_t, tile, [8192]);
  for (int i = threadIdx.x; i < 8192; i += blockDim.x) tile[i] = bf16_of(1);
  __syncthreads();
  const uint32_t s = ptx::smem_addr(tile);
  const uint32_t sa = (s + 1023u) & ~1023u;
  float d[4] = {0, 0, 0, 0};
  const uint64_t da = ptx::wgmma_desc(sa, 16, 1024, 128), db = ptx::wgmma_desc(sa, 16, 1024, 128);
  if (mode == 0 && threadIdx.x >= 32) return;  // only warp 0 of the warpgroup issues
  uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};  // bf16 ones
  ::simt::wgmma(d, 8, mode == 4 ? a : nullptr, da, db, true, 0, 0, true);
  ptx::wgmma_commit();
  if (mode == 1) d[0] = 5.f;  // accumulators changed before the wait
  if (mode == 4) a[2] = 0;    // register A changed before the wait
  if (mode == 2) return;      // exits with the group in flight
  ptx::wgmma_wait<0>();
}
TEST(SimtHopper, WgmmaMisuseFails) {
  EXPECT_TRUE(has(run([] { launch(wgmma_misuse_kernel, 1, 128, 0, nullptr, 0); }),
                  "different numbers of wgmma"));
  EXPECT_TRUE(has(run([] { launch(wgmma_misuse_kernel, 1, 128, 0, nullptr, 1); }),
                  "accumulators of a wgmma in flight were changed"));
  EXPECT_TRUE(has(run([] { launch(wgmma_misuse_kernel, 1, 128, 0, nullptr, 2); }),
                  "not retired by wgmma.wait_group"));
  EXPECT_TRUE(has(run([] { launch(wgmma_misuse_kernel, 1, 64, 0, nullptr, 3); }),
                  "needs the 4 warps of a warpgroup"));
  EXPECT_TRUE(has(run([] { launch(wgmma_misuse_kernel, 1, 128, 0, nullptr, 4); }),
                  "the A registers of a wgmma in flight were changed"));
}

// ---------------------------------------------------------------- TMA and mbarrier

// Global tensor (x 128 columns, y 10 rows, z 2) of bf16, element value (z * 10 + y) * 128 + x
// modulo 251 (exact in bf16). Box (64, 8, 1), 128-byte swizzle, copied from (64, 5, 1):
// rows 5..9 of z 1, then rows 10..12 out of bounds: zeros.
constexpr int kX = 128, kY = 10, kZ = 2;
int gval(int x, int y, int z) {
  return ((z * kY + y) * kX + x) % 251;
}

// mode 0: wait, then read every element back through the test's own swizzle formula.
// mode 1: read before waiting (the copy is in flight). mode 2: expect_tx announces half the
// bytes. mode 3: destination not 1024-byte aligned.
__global__ void tma_kernel(ptx::TmaMap map, int* out, int mode) {
  ST_SHARED_DYNAMIC(unsigned char, raw, 128);
  const uint32_t base = (ptx::smem_addr(raw) + 1023u) & ~1023u;
  const unsigned char* mem = raw + (base - ptx::smem_addr(raw));
  const uint32_t bar = base + 1024;  // after the 8 x 128-byte box
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar, 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ptx::mbar_arrive_expect_tx(bar, mode == 2 ? 512 : 1024);
    ptx::tma_load_3d(mode == 3 ? base + 128 : base, map, 64, 5, 1, bar);
  }
  if (mode != 1) ptx::mbar_wait(bar, 0);
  for (int i = threadIdx.x; i < 8 * 64; i += blockDim.x) {
    const int y = i / 64, x = i % 64;
    const int byte = (((2 * x) >> 4) ^ (y % 8)) << 4 | ((2 * x) & 15);
    out[i] = int_of_bf16(*reinterpret_cast<const uint16_t*>(mem + y * 128 + byte));
  }
}

TEST(SimtHopper, TmaCopySwizzlesAndFillsOutOfBounds) {
  std::vector<uint16_t> g(kX * kY * kZ);
  for (int z = 0; z < kZ; ++z)
    for (int y = 0; y < kY; ++y)
      for (int x = 0; x < kX; ++x) g[(z * kY + y) * kX + x] = bf16_of(gval(x, y, z));
  const uint64_t dims[3] = {kX, kY, kZ};
  const uint64_t strides[2] = {kX * 2, kX * kY * 2};
  const uint32_t box[3] = {64, 8, 1};
  const ptx::TmaMap map = ptx::make_tma_3d(g.data(), dims, strides, box, 128);
  std::vector<int> out(8 * 64, -1);
  ASSERT_EQ(cudaFuncSetAttribute(tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 4096),
            cudaSuccess);
  for (uint64_t seed : {1, 2}) {
    simt::options().schedule_seed = seed;
    ASSERT_EQ(run([&] { launch(tma_kernel, 1, 64, 4096, nullptr, map, out.data(), 0); }), "");
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 64; ++x)
        ASSERT_EQ(out[y * 64 + x], 5 + y < kY ? gval(64 + x, 5 + y, 1) : 0) << y << "," << x;
  }
  simt::options().schedule_seed = 0;
  EXPECT_TRUE(has(run([&] { launch(tma_kernel, 1, 64, 4096, nullptr, map, out.data(), 1); }),
                  "TMA copy in flight"));
  EXPECT_TRUE(has(run([&] { launch(tma_kernel, 1, 64, 4096, nullptr, map, out.data(), 2); }),
                  "more bytes than expect_tx"));
  EXPECT_TRUE(has(run([&] { launch(tma_kernel, 1, 64, 4096, nullptr, map, out.data(), 3); }),
                  "not aligned to 1024"));
  // The tensor map's own checks (as cuTensorMapEncodeTiled's).
  const uint32_t wide[3] = {128, 8, 1};  // 256 bytes inner with a 128-byte swizzle
  EXPECT_THROW(ptx::make_tma_3d(g.data(), dims, strides, wide, 128), std::invalid_argument);
  const uint64_t odd[2] = {kX * 2 + 2, kX * kY * 2};
  EXPECT_THROW(ptx::make_tma_3d(g.data(), dims, odd, box, 128), std::invalid_argument);
}

// Two phases of a barrier of count 32: warp 1's lanes arrive, warp 0 waits; a fresh
// barrier's "previous" phase (parity 1) counts as complete. out: what warp 0 saw.
__global__ void mbar_phase_kernel(int* out, int mode) {
  ST_SHARED(uint64_t, bars, [2]);
  ST_SHARED(int, data, [2]);
  const uint32_t bar = ptx::smem_addr(&bars[0]), bar2 = ptx::smem_addr(&bars[1]);
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar, 32);
    ptx::mbar_init(bar2, mode == 2 ? 1 : 32);
    ptx::mbar_wait(bar, 1);  // parity 1 of a fresh barrier: the phase "before" 0, complete
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (mode == 1) {  // nobody arrives: a deadlock the emulator must name
    ptx::mbar_wait(bar, 0);
    return;
  }
  if (mode == 2) {  // thread 0's arrival leaves the phase waiting for 16 bytes; warp 1's
    // lane 0 then arrives once more than the count (seed 0 runs thread 0 first)
    if (threadIdx.x == 0) ptx::mbar_arrive_expect_tx(bar2, 16);
    if (threadIdx.x == 32) ptx::mbar_arrive(bar2);
    return;
  }
  if (warp == 1) {
    for (int phase = 0; phase < 2; ++phase) {
      if (lane == 0) out[10 + phase] = phase;  // global, before the arrival
      ptx::mbar_arrive(bar);
      ptx::mbar_wait(bar2, phase & 1);  // warp 0 has read this phase's value
    }
  } else {
    for (int phase = 0; phase < 2; ++phase) {
      ptx::mbar_wait(bar, phase & 1);
      if (lane == 0) out[phase] = out[10 + phase] + 100;
      ptx::mbar_arrive(bar2);  // every lane: warp 1 goes on once all of warp 0 has seen it
    }
  }
  (void)data;
}

TEST(SimtHopper, MbarrierPhasesAndChecks) {
  for (uint64_t seed : {0, 1, 2}) {
    simt::options().schedule_seed = seed;
    std::vector<int> out(12, -1);
    ASSERT_EQ(run([&] { launch(mbar_phase_kernel, 1, 64, 0, nullptr, out.data(), 0); }), "");
    EXPECT_EQ(out[0], 100);
    EXPECT_EQ(out[1], 101);
  }
  simt::options().schedule_seed = 0;
  std::vector<int> out(12, -1);
  const std::string dl = run([&] { launch(mbar_phase_kernel, 1, 64, 0, nullptr, out.data(), 1); });
  EXPECT_TRUE(has(dl, "deadlock") && has(dl, "waits at mbarrier")) << dl;
  EXPECT_TRUE(has(run([&] { launch(mbar_phase_kernel, 1, 64, 0, nullptr, out.data(), 2); }),
                  "no arrival pending"));
}

// ---------------------------------------------------------------- named barriers, setmaxnreg

// Warps 0-1 take turns with warps 2-3 through bar 1 / bar 2 (the ping-pong pattern of the
// sm_90 flash kernel): each appends its id to a global log, which must alternate.
__global__ void named_bar_kernel(int* log, int mode) {
  const int half = threadIdx.x / 64, t = threadIdx.x % 64;
  if (mode == 1) {
    ptx::named_bar_sync(0, 128);
    return;
  }
  if (mode == 2) {
    ptx::named_bar_sync(1, half ? 64 : 128);
    return;
  }
  if (mode == 3) {
    ptx::setmaxnreg_inc<250>();
    return;
  }
  ptx::setmaxnreg_inc<240>();
  if (half == 1) ptx::named_bar_arrive(1, 128);
  for (int i = 0; i < 3; ++i) {
    ptx::named_bar_sync(1 + half, 128);
    if (t == 0) {
      int n = log[0];
      log[1 + n] = half;
      log[0] = n + 1;
    }
    ptx::named_bar_arrive(1 + (1 - half), 128);
  }
}

TEST(SimtHopper, NamedBarriersAndSetmaxnreg) {
  for (uint64_t seed : {0, 1, 2}) {
    simt::options().schedule_seed = seed;
    std::vector<int> log(8, 0);
    ASSERT_EQ(run([&] { launch(named_bar_kernel, 1, 128, 0, nullptr, log.data(), 0); }), "");
    ASSERT_EQ(log[0], 6);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(log[1 + i], i % 2) << "turn " << i;
  }
  simt::options().schedule_seed = 0;
  std::vector<int> log(8, 0);
  EXPECT_TRUE(has(run([&] { launch(named_bar_kernel, 1, 128, 0, nullptr, log.data(), 1); }),
                  "0 is __syncthreads'"));
  EXPECT_TRUE(has(run([&] { launch(named_bar_kernel, 1, 128, 0, nullptr, log.data(), 2); }),
                  "with counts"));
  EXPECT_TRUE(has(run([&] { launch(named_bar_kernel, 1, 128, 0, nullptr, log.data(), 3); }),
                  "setmaxnreg 250"));
}

}  // namespace
