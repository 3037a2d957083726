// The emulator's traffic counter and the cost model built on it (label emu): warp requests
// and the 32-byte sectors they touch on hand-worked access patterns (coalesced, strided,
// broadcast, 16-byte vectors, several warps and iterations), the dependent memory rounds
// between switch points, block sampling, counted math calls; the model's terms on a
// hand-worked launch; and the fit recovering known parameters from rows made with them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"
#include "simt/count_math.h"
#include "simt/cost/cost_model.h"
#include "simt/simt.h"

namespace {

using st::cudak::launch;

// Runs f with traffic counting on; returns the one launch it made.
template <class F>
simt::LaunchTraffic traced(F&& f, uint64_t max_blocks = 0) {
  simt::traffic_log().clear();
  simt::options().count_traffic = true;
  simt::options().max_blocks = max_blocks;
  f();
  simt::options().count_traffic = false;
  simt::options().max_blocks = 0;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << simt::last_failure();
  EXPECT_EQ(simt::traffic_log().size(), 1u);
  return simt::traffic_log().empty() ? simt::LaunchTraffic{} : simt::traffic_log().back();
}

struct alignas(16) Vec16 {
  float v[4];
};

__global__ void copy_strided(float* y, const float* x, int stride) {
  y[threadIdx.x] = x[threadIdx.x * stride];
}
__global__ void read_broadcast(float* y, const float* x) {
  y[threadIdx.x] = x[0];
}
__global__ void copy_vec16(Vec16* y, const Vec16* x) {
  y[threadIdx.x] = x[threadIdx.x];
}
// Eight 2-byte elements per lane, copied one by one: on the GPU one 16-byte access each.
__global__ void copy_halves(uint16_t* y, const uint16_t* x) {
  for (int k = 0; k < 8; ++k) y[threadIdx.x * 8 + k] = x[threadIdx.x * 8 + k];
}
// 64 threads (two warps), three iterations each: x[i * 64 + tid].
__global__ void copy_loop(float* y, const float* x) {
  float s = 0;
  for (int i = 0; i < 3; ++i) s += x[i * 64 + threadIdx.x];
  y[threadIdx.x] = s;
}
// 3 loads, a barrier, 5 loads, then stores (which never count as rounds).
__global__ void two_stretches(float* y, const float* x) {
  float s = 0;
  for (int i = 0; i < 3; ++i) s += x[i * 32 + threadIdx.x];
  __syncthreads();
  for (int i = 3; i < 8; ++i) s += x[i * 32 + threadIdx.x];
  y[threadIdx.x] = s;
  y[32 + threadIdx.x] = s;
}
__global__ void per_block(float* y, const float* x) {
  y[blockIdx.x * 32 + threadIdx.x] = x[blockIdx.x * 32 + threadIdx.x];
}
// Writes y, then reads it back: the read comes from the cache, not DRAM.
__global__ void write_then_read(float* y, float* z) {
  y[threadIdx.x] = 1.0f;
  z[threadIdx.x] = y[threadIdx.x] * 2.0f;
}
__global__ void with_math(float* y, const float* x) {
  y[threadIdx.x] = expf(x[threadIdx.x]) + tanhf(x[threadIdx.x]);
}

alignas(128) float g_x[4096];
alignas(128) float g_y[4096];

TEST(SimtTraffic, ACoalescedWarpReadIsOneRequestOfFourSectors) {
  const auto t = traced([] { launch(copy_strided, 1, 32, 0, nullptr, g_y, g_x, 1); });
  EXPECT_EQ(t.requests_rd, 1u);
  EXPECT_EQ(t.sectors_rd, 4u);  // 32 lanes x 4 bytes = 128 bytes = 4 sectors
  EXPECT_EQ(t.unique_rd, 4u);
  EXPECT_EQ(t.bytes_rd, 128u);
  EXPECT_EQ(t.requests_wr, 1u);
  EXPECT_EQ(t.sectors_wr, 4u);
  EXPECT_EQ(t.blocks_total, 1u);
  EXPECT_EQ(t.threads_per_block, 32u);
}

TEST(SimtTraffic, A32ByteStrideCostsASectorPerLane) {
  const auto t = traced([] { launch(copy_strided, 1, 32, 0, nullptr, g_y, g_x, 8); });
  EXPECT_EQ(t.requests_rd, 1u);
  EXPECT_EQ(t.sectors_rd, 32u);
  EXPECT_EQ(t.bytes_rd, 128u);  // the same bytes asked for, 8x the sectors
  const auto t2 = traced([] { launch(copy_strided, 1, 32, 0, nullptr, g_y, g_x, 2); });
  EXPECT_EQ(t2.sectors_rd, 8u);  // 8-byte stride: 256 bytes spanned
}

TEST(SimtTraffic, ABroadcastIsOneSector) {
  const auto t = traced([] { launch(read_broadcast, 1, 32, 0, nullptr, g_y, g_x); });
  EXPECT_EQ(t.requests_rd, 1u);
  EXPECT_EQ(t.sectors_rd, 1u);
  EXPECT_EQ(t.unique_rd, 1u);
}

TEST(SimtTraffic, SixteenByteVectorsTouchSixteenSectorsPerWarp) {
  static Vec16 x[64], y[64];
  const auto t = traced([] { launch(copy_vec16, 1, 32, 0, nullptr, y, x); });
  EXPECT_EQ(t.bytes_rd, 512u);
  EXPECT_EQ(t.sectors_rd, 16u);
  EXPECT_EQ(t.unique_rd, 16u);
  EXPECT_EQ(t.unique_wr, 16u);
}

TEST(SimtTraffic, AVectorCopiedElementByElementIsOneRequest) {
  alignas(128) static uint16_t x[512], y[512];
  const auto t = traced([] { launch(copy_halves, 1, 32, 0, nullptr, y, x); });
  EXPECT_EQ(t.requests_rd, 1u);
  EXPECT_EQ(t.requests_wr, 1u);
  EXPECT_EQ(t.sectors_rd, 16u);
  EXPECT_EQ(t.bytes_rd, 512u);
  EXPECT_EQ(t.rounds[0], 1u);  // one load instruction
}

TEST(SimtTraffic, RequestsAreCountedPerWarpAndPerExecution) {
  const auto t = traced([] { launch(copy_loop, 1, 64, 0, nullptr, g_y, g_x); });
  EXPECT_EQ(t.requests_rd, 6u);  // 2 warps x 3 iterations
  EXPECT_EQ(t.sectors_rd, 24u);
  EXPECT_EQ(t.unique_rd, 24u);  // 3 x 64 floats = 768 bytes
  EXPECT_EQ(t.requests_wr, 2u);
  // one stretch of 3 loads: rounds 3, 2, 1, 1, 1 for U = 1, 2, 4, 8, 16
  EXPECT_EQ(t.rounds[0], 3u);
  EXPECT_EQ(t.rounds[1], 2u);
  EXPECT_EQ(t.rounds[2], 1u);
  EXPECT_EQ(t.rounds[4], 1u);
}

TEST(SimtTraffic, ABarrierEndsAStretchOfLoads) {
  const auto t = traced([] { launch(two_stretches, 1, 32, 0, nullptr, g_y, g_x); });
  EXPECT_EQ(t.rounds[0], 8u);  // 3 + 5
  EXPECT_EQ(t.rounds[1], 5u);  // 2 + 3
  EXPECT_EQ(t.rounds[2], 3u);  // 1 + 2
  EXPECT_EQ(t.rounds[3], 2u);  // 1 + 1
  EXPECT_EQ(t.rounds[4], 2u);
  EXPECT_EQ(t.requests_wr, 2u);
  EXPECT_EQ(t.unique_wr, 8u);
}

TEST(SimtTraffic, ReadingBackWhatTheLaunchWroteIsNoDramRead) {
  const auto t = traced([] { launch(write_then_read, 1, 32, 0, nullptr, g_y, g_x); });
  EXPECT_EQ(t.requests_rd, 1u);
  EXPECT_EQ(t.sectors_rd, 4u);  // the request still touches its sectors
  EXPECT_EQ(t.unique_rd, 0u);   // but none is read from DRAM
  EXPECT_EQ(t.unique_wr, 8u);   // y and z
}

TEST(SimtTraffic, MaxBlocksRunsAnEvenSample) {
  const auto t = traced([] { launch(per_block, 100, 32, 0, nullptr, g_y, g_x); }, 10);
  EXPECT_EQ(t.blocks_total, 100u);
  EXPECT_EQ(t.blocks_run, 10u);
  EXPECT_EQ(t.requests_rd, 10u);
  EXPECT_EQ(t.unique_rd, 40u);
  // blocks 0, 10, 20, ...: block 10's element 320 was written, block 5's (160) was not
  g_y[320] = g_y[160] = -1.0f;
  g_x[320] = 7.0f;
  g_x[160] = 9.0f;
  traced([] { launch(per_block, 100, 32, 0, nullptr, g_y, g_x); }, 10);
  EXPECT_EQ(g_y[320], 7.0f);
  EXPECT_EQ(g_y[160], -1.0f);
}

TEST(SimtTraffic, MathCallsAreCountedPerThread) {
  const auto t = traced([] { launch(with_math, 1, 32, 0, nullptr, g_y, g_x); });
  EXPECT_EQ(t.calls_expf, 32u);
  EXPECT_EQ(t.calls_tanhf, 32u);
  EXPECT_EQ(t.calls_logf, 0u);
}

TEST(SimtTraffic, NothingIsCountedWhenOff) {
  simt::traffic_log().clear();
  launch(copy_strided, 1, 32, 0, nullptr, g_y, g_x, 1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(simt::traffic_log().empty());
}

// ---------------------------------------------------------------- compute-side counts (issue 43)
// Shared memory: 32 banks of 4 bytes; a warp request costs the largest number of distinct
// words it touches in one bank. Every kernel here runs one warp unless stated.

// Lane l writes word l * stride of a shared array, then (after a barrier) reads it back.
__global__ void shared_strided(float* y, int stride) {
  ST_SHARED(float, s, [32 * 32]);
  s[threadIdx.x * stride] = static_cast<float>(threadIdx.x);
  __syncthreads();
  y[threadIdx.x] = s[threadIdx.x * stride];
}
// Every lane reads the same word: a broadcast.
__global__ void shared_broadcast(float* y) {
  ST_SHARED(float, s, [32]);
  if (threadIdx.x == 0) s[0] = 1.0f;
  __syncthreads();
  y[threadIdx.x] = s[0];
}
// A 16-byte vector per lane (LDS.128: 512 bytes, 4 wavefronts at best), copied by the host
// compiler element by element: still one request per instruction.
__global__ void shared_vec16(Vec16* y) {
  ST_SHARED(Vec16, s, [32]);
  Vec16 v;
  for (int k = 0; k < 4; ++k) v.v[k] = static_cast<float>(threadIdx.x * 4 + k);
  s[threadIdx.x] = v;
  __syncthreads();
  y[threadIdx.x] = s[threadIdx.x];
}
// One ldmatrix.x4 over a 16 x 16 bf16 tile stored with a row pitch of `pitch` elements, as
// the flash kernels' lds_a addresses it: lane l gives row l % 16, column 8 * (l / 16).
// Pitch 72 (64 + 8, the kernels' kPitch<64>: 144 bytes, rows 4 banks apart) is conflict
// free (1 wavefront per 8x8 matrix); pitch 64 (128 bytes) puts all 8 rows of a matrix in
// the same 4 banks: 8 wavefronts per matrix.
__global__ void ldsm_tile(uint32_t* y, int pitch) {
  ST_SHARED(uint16_t, s, [16 * 72]);
  for (int i = threadIdx.x; i < 16 * 72; i += 32) s[i] = static_cast<uint16_t>(i);
  __syncthreads();
  const int l = threadIdx.x;
  uint32_t r[4];
  st::ptx::ldmatrix_x4(r, st::ptx::smem_addr(&s[(l % 16) * pitch + 8 * (l / 16)]));
  y[l] = r[0] ^ r[1] ^ r[2] ^ r[3];
}
// n mma.sync per warp and `bars` barriers per block.
__global__ void mma_and_barriers(float* y, int n, int bars) {
  float d[4] = {0, 0, 0, 0};
  const uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};  // bf16 1.0
  for (int i = 0; i < n; ++i) st::ptx::mma_16816<__nv_bfloat16>(d, a, a[0], a[1]);
  for (int i = 0; i < bars; ++i) __syncthreads();
  y[blockIdx.x * blockDim.x + threadIdx.x] = d[0];
}
__global__ void with_ex2(float* y, const float* x) {
  y[threadIdx.x] = st::ptx::ex2_approx(x[threadIdx.x]);
}

TEST(SimtCompute, AConflictFreeSharedAccessIsOneWavefront) {
  const auto t = traced([] { launch(shared_strided, 1, 32, 0, nullptr, g_y, 1); });
  EXPECT_EQ(t.smem_requests, 2u);    // the store and the load
  EXPECT_EQ(t.smem_wavefronts, 2u);  // one each
  EXPECT_EQ(t.barriers, 1u);
}

TEST(SimtCompute, BankConflictsCostOneWavefrontPerWordInTheBusiestBank) {
  // stride 2: words 0, 2, .., 62 -> 16 banks with 2 words each
  const auto t2 = traced([] { launch(shared_strided, 1, 32, 0, nullptr, g_y, 2); });
  EXPECT_EQ(t2.smem_requests, 2u);
  EXPECT_EQ(t2.smem_wavefronts, 2u * 2u);
  // stride 8: words 0, 8, .., 248 -> banks 0, 8, 16, 24 with 8 words each
  const auto t8 = traced([] { launch(shared_strided, 1, 32, 0, nullptr, g_y, 8); });
  EXPECT_EQ(t8.smem_wavefronts, 2u * 8u);
  // stride 32: every lane in bank 0
  const auto t32 = traced([] { launch(shared_strided, 1, 32, 0, nullptr, g_y, 32); });
  EXPECT_EQ(t32.smem_wavefronts, 2u * 32u);
}

TEST(SimtCompute, ABroadcastIsOneWavefront) {
  const auto t = traced([] { launch(shared_broadcast, 1, 32, 0, nullptr, g_y); });
  EXPECT_EQ(t.smem_requests, 2u);    // lane 0's store, the warp's load
  EXPECT_EQ(t.smem_wavefronts, 2u);
}

TEST(SimtCompute, SixteenByteSharedVectorsAreOneRequestOfFourWavefronts) {
  Vec16* y = reinterpret_cast<Vec16*>(g_y);
  const auto t = traced([&] { launch(shared_vec16, 1, 32, 0, nullptr, y); });
  EXPECT_EQ(t.smem_requests, 2u);
  EXPECT_EQ(t.smem_wavefronts, 2u * 4u);
}

TEST(SimtCompute, LdmatrixWithThePaddedPitchIsConflictFree) {
  const auto pad = traced([] { launch(ldsm_tile, 1, 32, 0, nullptr, reinterpret_cast<uint32_t*>(g_y), 72); });
  EXPECT_EQ(pad.ldsm_insts, 1u);
  EXPECT_EQ(pad.ldsm_wavefronts, 4u);  // 4 matrices, 1 wavefront each
  const auto flat = traced([] { launch(ldsm_tile, 1, 32, 0, nullptr, reinterpret_cast<uint32_t*>(g_y), 64); });
  EXPECT_EQ(flat.ldsm_insts, 1u);
  EXPECT_EQ(flat.ldsm_wavefronts, 32u);  // 8-way conflicts in each of the 4 matrices
  // the fill loop: 16 * 72 / 32 = 36 stores of 2-byte elements by consecutive lanes
  EXPECT_EQ(pad.smem_requests, 36u);
  EXPECT_EQ(pad.smem_wavefronts, 36u);
}

TEST(SimtCompute, MmaSyncAndBarriersAreCountedPerWarpAndPerBlock) {
  // 4 blocks of 2 warps, 5 mma.sync per warp, 3 barriers per block
  const auto t = traced([] { launch(mma_and_barriers, 4, 64, 0, nullptr, g_y, 5, 3); });
  EXPECT_EQ(t.mma_sync, 4u * 2u * 5u);
  EXPECT_EQ(t.barriers, 4u * 3u);
  ASSERT_EQ(t.blocks.size(), 4u);
  for (const auto& b : t.blocks) {
    EXPECT_EQ(b.mma_sync, 10u);
    EXPECT_EQ(b.barriers, 3u);
  }
  // sampled: 2 of 10 blocks run; counts are those of the blocks run
  const auto s = traced([] { launch(mma_and_barriers, 10, 64, 0, nullptr, g_y, 7, 1); }, 2);
  EXPECT_EQ(s.blocks_run, 2u);
  EXPECT_EQ(s.mma_sync, 2u * 2u * 7u);
  EXPECT_EQ(s.barriers, 2u);
  ASSERT_EQ(s.blocks.size(), 2u);
  EXPECT_EQ(s.blocks[0].idx.x, 0u);
  EXPECT_EQ(s.blocks[1].idx.x, 5u);
}

TEST(SimtCompute, Ex2ApproxIsCountedAsExp2f) {
  const auto t = traced([] { launch(with_ex2, 1, 32, 0, nullptr, g_y, g_x); });
  EXPECT_EQ(t.calls_exp2f, 32u);
}

// ---------------------------------------------------------------- the model

TEST(CostModel, OccupancyFromThreadsAndSharedMemory) {
  const st::cost::Gpu g;
  EXPECT_EQ(st::cost::blocks_per_sm(g, 256, 0), 8);
  EXPECT_EQ(st::cost::blocks_per_sm(g, 1024, 0), 2);
  EXPECT_EQ(st::cost::blocks_per_sm(g, 32, 0), 32);  // the block limit, not 64
  EXPECT_EQ(st::cost::blocks_per_sm(g, 128, 100 * 1024), 2);  // 228 KB / (100 KB + 1 KB)
  EXPECT_EQ(st::cost::blocks_per_sm(g, 100, 0), 16);  // 100 threads take 4 warps: 2048 / 128
}

TEST(CostModel, HandWorkedLaunch) {
  // 2640 blocks of 256 threads (8 per SM: 2.5 waves -> 3), 1e6 sectors each way over all
  // blocks (half the grid emulated, so the counts scale by 2), 4 rounds at U = 4,
  // 1e6 expf calls in the emulated half.
  simt::LaunchTraffic l;
  l.blocks_total = 2640;
  l.blocks_run = 1320;
  l.threads_per_block = 256;
  l.unique_rd = 250000;
  l.unique_wr = 250000;
  l.rounds[2] = 4;
  l.calls_expf = 1000000;
  const st::cost::Gpu g;
  st::cost::Params p;
  p.t_launch_us = 2;
  p.latency_us = 1;
  p.u_log2 = 2;
  p.k_math = 0.5;
  p.overlap = 0.5;
  p.wave_exp = 1.0;
  const st::cost::MathCost m{10, 0, 0, 0};
  const auto k = st::cost::predict_kernel(l, g, p, m);
  EXPECT_DOUBLE_EQ(k.dram_bytes, 32e6);
  EXPECT_NEAR(k.t_dram, 32e6 / 4174e3, 1e-9);  // 7.667 us
  EXPECT_EQ(k.blocks_per_sm, 8);
  EXPECT_DOUBLE_EQ(k.waves, 3.0);
  EXPECT_DOUBLE_EQ(k.t_latency, 12.0);  // 3 waves x 4 rounds x 1 us: latency-bound
  const double lanes_per_us = 132 * 128 * 1.98e3;
  EXPECT_NEAR(k.t_math, 2e6 * 10 / (0.5 * lanes_per_us), 1e-9);
  EXPECT_DOUBLE_EQ(k.t_issue, 0.0);  // no requests recorded
  // launch + the longer term + half the shorter one + math
  EXPECT_NEAR(k.t, 2 + 12 + 0.5 * (32e6 / 4174e3) + k.t_math, 1e-9);
  l.requests_rd = 66000000;  // 2 x 66e6 requests / (132 SMs x 1000 per us) = 1000 us
  const auto k2 = st::cost::predict_kernel(l, g, p, m);
  EXPECT_NEAR(k2.t_issue, 1000.0, 1e-9);
  EXPECT_NEAR(k2.t, 2 + 1000 + 0.5 * 12 + k.t_math, 1e-9);  // request-bound
}

TEST(CostModel, TheFitRecoversTheParametersRowsWereMadeWith) {
  const st::cost::Gpu g;
  const st::cost::MathCost m{20, 40, 25, 1};
  st::cost::Params truth;
  truth.t_launch_us = 2.5;
  truth.latency_us = 0.7;
  truth.u_log2 = 3;
  truth.k_math = 0.4;
  truth.t_upload_us = 6;
  truth.t_fetch_us = 9;
  truth.overlap = 0.4;
  truth.req_per_us = 1000;
  truth.wave_exp = 1.0;
  std::vector<st::cost::Row> rows;
  auto launch_of = [](uint64_t blocks, uint64_t sectors, uint64_t r3, uint64_t r2, uint64_t ex) {
    simt::LaunchTraffic l;
    l.blocks_total = l.blocks_run = blocks;
    l.threads_per_block = 256;
    l.unique_rd = sectors;
    for (int k = 0; k < simt::LaunchTraffic::kRoundWidths; ++k) l.rounds[k] = k == 3 ? r3 : r2;
    l.calls_expf = ex;
    return l;
  };
  // bandwidth-, latency-, math-, launch-, upload- and fetch-dominated rows
  const uint64_t spec[][6] = {{8192, 4000000, 1, 1, 0, 0},    {1056, 10000, 40, 80, 0, 0},
                              {2112, 100000, 6, 11, 0, 0},    {1024, 300000, 2, 3, 30000000, 0},
                              {1, 10, 1, 1, 0, 1},            {132, 50000, 2, 4, 0, 2},
                              {33792, 2000000, 3, 5, 1000000, 0}, {264, 1000, 1, 2, 0, 0}};
  for (const auto& s : spec) {
    st::cost::Row r;
    r.launches.push_back(launch_of(s[0], s[1], s[2], s[3], s[4]));
    if (s[5] == 1) r.uploads = 1;
    if (s[5] == 2) r.fetches = 1;
    r.measured_us = st::cost::predict_row(r, g, truth, m);
    rows.push_back(r);
  }
  const st::cost::Params p = st::cost::fit(rows, g, m);
  // a coordinate search over 8 parameters: close, not exact
  EXPECT_LT(st::cost::max_abs_log_error(rows, g, p, m), 0.03);
  EXPECT_EQ(p.u_log2, 3);
  EXPECT_NEAR(p.latency_us, truth.latency_us, 0.1 * truth.latency_us);
  EXPECT_NEAR(p.t_launch_us, truth.t_launch_us, 0.1 * truth.t_launch_us);
}

}  // namespace

// ---------------------------------------------------------------- the compute model (issue 43)

namespace compute {

TEST(ComputeModel, OccupancyFromRegisters) {
  const st::cost::Gpu g;
  // 191 registers: 191 x 32 = 6112 -> 6144 per warp; 8 warps = 49152 of 65536: one block
  EXPECT_EQ(st::cost::blocks_per_sm_regs(g, 256, 92160, 191), 1);
  // 128 registers: 4096 per warp, 32768 per block: two (shared memory allows 2 as well)
  EXPECT_EQ(st::cost::blocks_per_sm_regs(g, 256, 92160, 128), 2);
  // 64 registers, no shared memory: 4 by registers (16384 per block), 8 by threads
  EXPECT_EQ(st::cost::blocks_per_sm_regs(g, 256, 0, 64), 4);
  // registers unknown: threads and shared memory alone
  EXPECT_EQ(st::cost::blocks_per_sm_regs(g, 256, 0, 0), 8);
}

simt::LaunchTraffic::BlockCounts block(unsigned y, uint64_t mma) {
  simt::LaunchTraffic::BlockCounts b{};
  b.idx = uint3{0, y, 0};
  b.mma_sync = mma;
  return b;
}

st::cost::ComputeParams bare() {  // the tensor pipe alone, no fixed costs
  st::cost::ComputeParams p;
  p.e_tensor = 1;
  p.alu_per_exp = p.alu_per_mma = 0;
  p.overlap = 0;
  p.barrier_clk = p.block_clk = 0;
  p.t_launch_us = 0;
  return p;
}

TEST(ComputeModel, HandWorkedPipesAndWaves) {
  // 264 average blocks of 256 threads at 255 registers (1 per SM: 2 waves on 132 SMs),
  // 1000 mma.sync each: 1000 x 4096 FLOP / (4096 x 2/3 per clock) = 1500 clocks a block
  simt::LaunchTraffic l;
  l.blocks_total = 264;
  l.blocks_run = 2;
  l.threads_per_block = 256;
  l.mma_sync = 2000;
  const st::cost::Gpu g;
  st::cost::ComputeParams p = bare();
  auto k = st::cost::predict_attention_kernel(l, g, p, 255);
  EXPECT_EQ(k.blocks_per_sm, 1);
  EXPECT_NEAR(k.makespan_us, 3000 / 1980.0, 1e-9);
  EXPECT_NEAR(k.imbalance, 1.0, 1e-12);
  EXPECT_STREQ(k.bound, "tensor");
  // + 16000 ex2 per block: MUFU 16000 / 16 = 1000 clocks; ALU 8 per ex2: 1000 clocks;
  // overlap 0.5: 1500 + 0.5 x 2000 = 2500 clocks a block
  l.calls_exp2f = 32000;
  p.alu_per_exp = 8;
  p.overlap = 0.5;
  k = st::cost::predict_attention_kernel(l, g, p, 255);
  EXPECT_NEAR(k.makespan_us, 5000 / 1980.0, 1e-9);
  // a barrier stall of 10 clocks x 3 barriers per block and 200 clocks per block
  l.barriers = 6;
  p.barrier_clk = 10;
  p.block_clk = 200;
  p.t_launch_us = 2;
  k = st::cost::predict_attention_kernel(l, g, p, 255);
  EXPECT_NEAR(k.t, 2 + 2 * (2500 + 30 + 200) / 1980.0, 1e-9);
}

TEST(ComputeModel, UnequalBlocksAreInterpolatedOverYAndScheduled) {
  // 2 SMs; grid (2, 4); the blocks run are y = 0 (400 mma.sync: 600 clocks) and y = 2 (200:
  // 300 clocks); y = 1 is interpolated (450), y = 3 extrapolated (150). Launch order: both
  // y = 0 blocks, then y = 1, ...: each SM runs one block of each y: 1500 clocks.
  st::cost::Gpu g;
  g.sms = 2;
  simt::LaunchTraffic l;
  l.grid = uint3{2, 4, 1};
  l.blocks_total = 8;
  l.blocks_run = 2;
  l.threads_per_block = 1024;  // 1 block per SM (threads)
  l.blocks = {block(0, 400), block(2, 200)};
  l.mma_sync = 600;
  auto k = st::cost::predict_attention_kernel(l, g, bare(), 0);
  EXPECT_EQ(k.blocks_per_sm, 2);  // 2048 threads: two blocks of 1024 share an SM
  // two slots per SM share its pipes: each block takes twice its time; 4 slots, 8 blocks:
  // slots get (1200, 1200, 900, 900) after y 0, 1, then y 2 (600) goes to the two 900s ...
  // equal total work per SM pair: makespan = (2 x (600 + 450 + 300 + 150) x 2) / 4 = 1500
  EXPECT_NEAR(k.makespan_us, 1500 / 1980.0, 1e-9);
  // three equal blocks on two SMs (1 slot each): 600, 600, then 1200
  simt::LaunchTraffic e;
  e.grid = uint3{1, 3, 1};
  e.blocks_total = e.blocks_run = 3;
  e.threads_per_block = 2048 / 2 + 32;  // 1056 threads: one block per SM
  e.blocks = {block(0, 400), block(1, 400), block(2, 400)};
  k = st::cost::predict_attention_kernel(e, g, bare(), 0);
  EXPECT_EQ(k.blocks_per_sm, 1);
  EXPECT_NEAR(k.makespan_us, 1200 / 1980.0, 1e-9);
  EXPECT_NEAR(k.imbalance, 1200 / 900.0, 1e-12);
}

}  // namespace compute
