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

}  // namespace st::cost
