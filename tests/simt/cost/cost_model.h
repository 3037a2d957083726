// A cost model of memory-bound kernels on an H100/H200, computed on the CPU from what the
// SIMT emulator saw of a launch (simt::LaunchTraffic) and the launch's shape. Issue 41's
// instrument: every new kernel gets a predicted time before a GPU runs it.
//
// One kernel launch:
//   t = t_launch + max(T_mem, T_latency) + overlap x min(T_mem, T_latency) + T_math
//   T_mem     = max(T_dram, T_issue)
//   T_dram    = distinct 32-byte sectors read and written (scaled from the blocks the
//               emulator ran to the whole grid) x 32 B / the measured copy bandwidth
//   T_issue   = warp requests / (SMs x requests one SM serves per microsecond): what
//               scalar 2-byte loads cost against 16-byte vectors of the same bytes
//   T_latency = waves^w x rounds(U) x L: the slowest thread's dependent memory rounds (its
//               loads between two switch points are in flight together, U at a time),
//               times the waves of resident blocks (occupancy from threads and shared
//               memory per block on an sm_90 SM) to the power w (0: blocks of later waves
//               hide their latency behind earlier ones' transfers; 1: not at all), times
//               the latency of one round;
//               overlap (0..1) is how much of the shorter of the two is not hidden
//   T_math    = transcendental calls x their SASS instruction counts / (k_math x the FP32
//               lanes of the GPU x its clock)
// A benchmark row adds host-side terms for what the CUDA backend does around its kernels:
// uploads of host int32 arrays (upload_ints: pinned copy, H2D copy, event) and fetches of a
// small result (D2H copy and a stream synchronization: the GPU drains).
//
// The GPU constants are the H200's (132 SMs, 1.98 GHz boost, the copy bandwidth measured by
// bench_gpu kernels); t_launch, L, U, w, overlap, the request rate, k_math, t_upload and
// t_fetch are fitted to measured rows (fit()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "simt/simt.h"

namespace st::cost {

struct Gpu {
  int sms = 132;
  double clock_ghz = 1.98;
  int fp32_lanes_per_sm = 128;
  int max_threads_per_sm = 2048, max_blocks_per_sm = 32;
  int smem_per_sm = 233472;  // 228 KB; each block also reserves 1 KB
  double copy_gbs = 4174.0;  // cudaMemcpy D2D, read + write, measured (bench_gpu kernels)
};

struct Params {
  double t_launch_us = 2.0;  // per kernel launch (and per memset node)
  double latency_us = 0.8;   // one dependent memory round
  int u_log2 = 2;            // loads in flight per thread: U = 2^u_log2
  double k_math = 0.5;       // issue efficiency of the transcendental routines
  double overlap = 0.5;      // share of min(T_mem, T_latency) not hidden behind the other
  double wave_exp = 0.5;     // w: how latency grows with the number of waves (0..1)
  double req_per_us = 1000;  // warp requests one SM serves per microsecond
  double t_upload_us = 5.0;  // one upload_ints
  double t_fetch_us = 8.0;   // one fetch_small (D2H + synchronize)
};

// PTX instructions of one call of each function for sm_90 (nvcc 13.0 -O3 --fmad=false, the
// kernel's flags): a kernel y[i] = f(x[i]) less the same kernel with y[i] = x[i]
// (tests/simt/cost/README.md; this machine's CUDA has no cuobjdump for SASS counts).
struct MathCost {
  double expf = 0, logf = 0, tanhf = 0, exp2f = 0;
};
MathCost sm90_math_cost();

struct KernelTerms {
  double dram_bytes = 0, t_dram = 0, t_issue = 0, t_latency = 0, t_math = 0, t = 0;
  double waves = 0;
  uint64_t rounds = 0;
  int blocks_per_sm = 0;
  double coalescing = 0;  // bytes the lanes asked for / bytes of the sectors their requests touch
};

// Resident blocks per SM for this launch shape.
int blocks_per_sm(const Gpu& g, unsigned threads_per_block, size_t smem_bytes);
KernelTerms predict_kernel(const simt::LaunchTraffic& l, const Gpu& g, const Params& p,
                           const MathCost& m);

// A measured (or only predicted) benchmark row: its kernels and its host-side work.
struct Row {
  std::string name, shape;
  double measured_us = 0;  // <= 0: no measurement (a prediction only)
  std::vector<simt::LaunchTraffic> launches;
  int uploads = 0, fetches = 0, memsets = 0;
  double driver_bytes = 0;  // a cudaMemcpy/cudaMemset of this many bytes (no kernel)
  std::string excluded;     // non-empty: not used in the fit, with the reason
};
double predict_row(const Row& r, const Gpu& g, const Params& p, const MathCost& m);

// The parameters fitted on 2026-11-28 to the 14 measured rows of simt_cost_model, with every
// kernel as it was when the H200 measured it (commit 847381e): the calibration predictions
// use, so that a kernel changed since keeps being predicted by the same model.
Params h200_calibration();

// Fits the continuous parameters (and U) to the rows with a measurement and no exclusion,
// minimising the sum of squared log(predicted / measured). `skip`: a row index left out
// (leave-one-out), or -1. max_abs_log_error: the largest |log(predicted / measured)|.
Params fit(const std::vector<Row>& rows, const Gpu& g, const MathCost& m, int skip = -1);
double max_abs_log_error(const std::vector<Row>& rows, const Gpu& g, const Params& p,
                         const MathCost& m, int skip = -1);


// ---------------------------------------------------------------- compute-bound kernels
// (issue 43) The pipes that bound attention kernels on an sm_90 SM, from the compute-side
// counts of simt::LaunchTraffic (mma.sync, wgmma, ex2, shared wavefronts, barriers; per block
// run) and the kernel's ptxas register count. One launch:
//
//   t = t_launch + makespan / clock
//   makespan: the grid's blocks, in launch order (blockIdx.x fastest: the order the GPU
//     dispatches them; the causal flash grids put their heaviest tiles first), each given to
//     the first of the SMs x R resident-block slots to come free (R: blocks per SM from
//     registers, threads and shared memory, blocks_per_sm_regs); a block's time is
//       t_b = R x busy_b + barrier_clk x barriers_b + block_clk
//     (R blocks share their SM's pipes; barrier stalls and the block's fill/drain are
//     latency, not pipe time).
//   busy_b = max(pipes) + overlap x (sum(pipes) - max(pipes)), in SM clocks, pipes:
//     tensor = mma_sync x 4096 FLOP / (mma_flop_per_clk x e_tensor)
//              + wgmma_macs x 2 / (wgmma_flop_per_clk x e_tensor)
//     mufu   = calls_exp2f / mufu_per_clk                       (MUFU.EX2)
//     alu    = (alu_per_exp x calls_exp2f + alu_per_mma x 32 x mma_sync) / fp32_per_clk
//              (FP32/INT instructions the emulator does not count: modelled per softmax
//              element, i.e. per ex2, and per mma.sync, i.e. fragment conversions)
//     smem   = ldsm_wavefronts + smem_wavefronts + tma_bytes / 128  (1 wavefront per clock)
//   Blocks the emulator did not run are interpolated over blockIdx.y from the blocks it ran
//   (blocks with the same y alike: the attention grids are x = batch*head, y = tile), or,
//   without per-block counts, each is the launch's average block.
//
// The rates (ComputeRates) are per-clock figures derived from published sm_90 numbers (the
// model's clock is Gpu::clock_ghz); e_tensor, alu_per_exp, alu_per_mma, overlap, barrier_clk
// and block_clk are fitted to measured rows (fit_compute). alu_per_* and block_clk are
// effective figures: they also carry the stalls of a kernel at few warps per SM.
struct ComputeRates {
  // Dense BF16 tensor FLOP per clock per SM, wgmma: NVIDIA's H100/H200 SXM datasheet figure
  // 989.4 TFLOP/s = 132 SMs x 1.83 GHz x 4096.
  double wgmma_flop_per_clk = 4096;
  // mma.sync m16n8k16 on sm_90: about 2/3 of the wgmma rate (the figure issue 43 gives; not
  // measured here). e_tensor scales both.
  double mma_flop_per_clk = 4096.0 * 2.0 / 3.0;
  double mufu_per_clk = 16;   // ex2 per clock per SM (CUDA C++ Programming Guide, cc 9.0)
  double fp32_per_clk = 128;  // FP32 lanes per SM (4 warp instructions per clock)
  double fp64_per_clk = 64;   // FP64 lanes per SM (H100 SXM datasheet: 34 TFLOP/s FP64
                              // = 132 SMs x 1.98 GHz x 64 x 2)
  int regs_per_sm = 65536;
  int reg_alloc_per_warp = 256;  // registers are allocated per warp in units of 256
};

struct ComputeParams {
  double e_tensor = 0.8;      // share of the tensor rate the kernel's mma stream reaches
  double alu_per_exp = 40;    // FP32/INT instructions per softmax element (per ex2 call)
  double alu_per_mma = 4;     // FP32/INT instructions per mma.sync per lane
  double overlap = 0.3;       // share of the non-bounding pipes' time not hidden (0..1)
  double barrier_clk = 100;   // stall per __syncthreads per block (clocks)
  double block_clk = 2000;    // a block's fill and drain (clocks)
  double gemm_tflops = 500;   // cuBLASLt's rate on the baseline's batched head GEMMs
  double k_fp64 = 0.5;        // share of the FP64 rate the baseline's softmax reaches
  double mem_block_clk = 500; // fixed cost of one block of a memory-bound launch of a row
                              // (clocks; its resident blocks overlap): what the memory
                              // model lacks for grids of many short blocks (one per row)
  double t_launch_us = 3.0;   // per launch (not fitted: the launch overhead bench_gpu shows)
};

// Resident blocks per SM: threads, shared memory (1 KB reserved per block), the 32-block
// limit, and registers (regs_per_thread from ptxas -v; allocated per warp in units of 256,
// 65536 per SM). regs_per_thread <= 0: no register limit (blocks_per_sm).
int blocks_per_sm_regs(const Gpu& g, unsigned threads_per_block, size_t smem_bytes,
                       int regs_per_thread, const ComputeRates& r = ComputeRates{});

struct ComputeTerms {
  // the pipes' busy time of the whole grid spread evenly over the SMs (microseconds)
  double t_tensor = 0, t_mufu = 0, t_alu = 0, t_smem = 0, t_barrier = 0;
  double makespan_us = 0;  // the scheduled grid
  double imbalance = 0;    // makespan / (sum of block times / slots)
  double t = 0;            // t_launch + makespan
  int blocks_per_sm = 0;
  const char* bound = "";  // the largest pipe summed over the grid
};

// The prediction for one launch of a compute-bound kernel (a new attention kernel: mma.sync
// or wgmma, TMA or cp.async) from its emulated counts and its ptxas register count. Reads
// LaunchTraffic::blocks_total, blocks_run, threads_per_block, smem_bytes, grid, blocks[]
// (per block: mma_sync, wgmma_macs, ldsm_wavefronts, smem_wavefronts, barriers,
// calls_exp2f, tma_bytes) or, without blocks[], the launch totals of the same fields.
// The wgmma path is not calibrated (no wgmma kernel has been measured): it uses the
// e_tensor fitted on the mma.sync kernels against the full wgmma rate.
ComputeTerms predict_attention_kernel(const simt::LaunchTraffic& l, const Gpu& g,
                                      const ComputeParams& p, int regs_per_thread,
                                      const ComputeRates& r = ComputeRates{});

// A measured row of compute-bound launches, memory-bound launches (predicted by
// predict_kernel with h200_calibration()) and cuBLASLt GEMMs (not emulated: each
// t_launch + max(FLOPs / gemm_tflops, bytes / Gpu::copy_gbs)).
struct ComputeRow {
  std::string name, shape;
  double measured_us = 0;
  std::vector<std::pair<simt::LaunchTraffic, int>> compute;  // launch, registers per thread
  std::vector<simt::LaunchTraffic> memory;
  std::vector<std::pair<double, double>> gemms;  // (FLOPs, bytes read + written) per GEMM
  // FP64 instructions of each memory-bound launch (the emulator does not count double
  // exp/div; the tool derives them from the shape; empty or 0: none): the launch takes
  // max(its memory-bound time, fp64_ops / (k_fp64 x fp64_per_clk x SMs x clock)) plus
  // blocks_total / (SMs x resident blocks) x mem_block_clk / clock
  std::vector<double> memory_fp64;
  std::string excluded;  // non-empty: not fitted
};
double predict_compute_row(const ComputeRow& r, const Gpu& g, const ComputeParams& p);

// The parameters fitted by simt_attention_cost --refit on 2026-11-29 to the H200 attention
// table of 2026-11-28 (flash, stabilized_flash and baseline; forward and backward; 10 shapes).
ComputeParams h200_attention_calibration();

// Fits e_tensor, alu_per_exp, alu_per_mma, overlap, barrier_clk, block_clk (the flash rows)
// and gemm_tflops, k_fp64, mem_block_clk (rows with GEMMs and memory-bound launches: the
// baseline's) to the rows
// with a measurement and no exclusion (least squares of log(predicted / measured)); skip: a
// row left out (leave-one-out), or -1. start: the search's starting point; first_step: its
// first multiplicative step (2: a search from afar; ~1.1 from a fitted point).
ComputeParams fit_compute(const std::vector<ComputeRow>& rows, const Gpu& g, int skip = -1,
                          const ComputeParams& start = ComputeParams{}, double first_step = 2.0);

}  // namespace st::cost
