// The cost model of memory-bound kernels (cost_model.h).
#include "simt/cost/cost_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <queue>

namespace st::cost {

MathCost sm90_math_cost() {
  // nvcc 13.0 -O3 -arch=sm_90 --fmad=false -ptx: 29, 53, 35, 12 instructions against 11 for
  // the identity kernel (measured 2026-11-28; README.md here gives the command).
  return MathCost{18, 42, 24, 1};
}

Params h200_calibration() {
  // `simt_cost_model --refit` at 847381e's kernels (full-precision line of its header).
  Params p;
  p.t_launch_us = 0.0;  // 7e-15: the fit puts a launch's fixed cost into its first round
  p.latency_us = 3.05811406;
  p.u_log2 = 9;  // U = 512: in effect one round per stretch that loads anything
  p.wave_exp = 0.0;  // 4e-16
  p.overlap = 1.0;
  p.req_per_us = 241.843964;
  p.k_math = 0.964760127;
  p.t_upload_us = 13.8578469;
  p.t_fetch_us = 24.6920817;
  return p;
}

int blocks_per_sm(const Gpu& g, unsigned threads_per_block, size_t smem_bytes) {
  int b = g.max_blocks_per_sm;
  if (threads_per_block > 0) {
    const unsigned warps = (threads_per_block + 31) / 32;  // threads are allocated by warp
    b = std::min(b, g.max_threads_per_sm / static_cast<int>(warps * 32));
  }
  b = std::min(b, static_cast<int>(g.smem_per_sm / (smem_bytes + 1024)));
  return std::max(b, 1);
}

KernelTerms predict_kernel(const simt::LaunchTraffic& l, const Gpu& g, const Params& p,
                           const MathCost& m) {
  KernelTerms k;
  const double scale = l.blocks_run ? static_cast<double>(l.blocks_total) / l.blocks_run : 1.0;
  k.dram_bytes = static_cast<double>(l.unique_rd + l.unique_wr) * 32.0 * scale;
  k.t_dram = k.dram_bytes / (g.copy_gbs * 1e3);  // GB/s -> bytes per microsecond
  k.blocks_per_sm = blocks_per_sm(g, l.threads_per_block, l.smem_bytes);
  k.waves = std::ceil(static_cast<double>(l.blocks_total) / (k.blocks_per_sm * g.sms));
  const int u = std::clamp(p.u_log2, 0, simt::LaunchTraffic::kRoundWidths - 1);
  k.rounds = l.rounds[u];
  k.t_latency = std::pow(k.waves, std::clamp(p.wave_exp, 0.0, 1.0)) *
                static_cast<double>(k.rounds) * p.latency_us;
  const double instr = (l.calls_expf * m.expf + l.calls_logf * m.logf + l.calls_tanhf * m.tanhf +
                        l.calls_exp2f * m.exp2f) *
                       scale;
  const double lanes_per_us = g.sms * g.fp32_lanes_per_sm * g.clock_ghz * 1e3;
  k.t_math = instr / (std::max(p.k_math, 1e-6) * lanes_per_us);
  const double asked = static_cast<double>(l.bytes_rd + l.bytes_wr);
  const double touched = 32.0 * static_cast<double>(l.sectors_rd + l.sectors_wr);
  k.coalescing = touched > 0 ? asked / touched : 0;
  k.t_issue = static_cast<double>(l.requests_rd + l.requests_wr) * scale /
              (g.sms * std::max(p.req_per_us, 1e-6));
  const double mem = std::max(k.t_dram, k.t_issue);
  k.t = p.t_launch_us + std::max(mem, k.t_latency) +
        std::clamp(p.overlap, 0.0, 1.0) * std::min(mem, k.t_latency) + k.t_math;
  return k;
}

double predict_row(const Row& r, const Gpu& g, const Params& p, const MathCost& m) {
  double t = 0;
  for (const auto& l : r.launches) t += predict_kernel(l, g, p, m).t;
  if (r.driver_bytes > 0) t += p.t_launch_us + r.driver_bytes / (g.copy_gbs * 1e3);
  t += r.uploads * p.t_upload_us + r.fetches * p.t_fetch_us + r.memsets * p.t_launch_us;
  return t;
}

namespace {

bool used(const Row& r, int i, int skip) {
  return i != skip && r.measured_us > 0 && r.excluded.empty();
}

// Objective: the sum of squared log errors (smooth, so the coordinate search does not stall
// on a kink), then the largest |log error|.
std::pair<double, double> objective(const std::vector<Row>& rows, const Gpu& g, const Params& p,
                                    const MathCost& m, int skip) {
  double mx = 0, ss = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!used(rows[i], static_cast<int>(i), skip)) continue;
    const double e = std::log(predict_row(rows[i], g, p, m) / rows[i].measured_us);
    mx = std::max(mx, std::fabs(e));
    ss += e * e;
  }
  return {ss, mx};
}

}  // namespace

double max_abs_log_error(const std::vector<Row>& rows, const Gpu& g, const Params& p,
                         const MathCost& m, int skip) {
  return objective(rows, g, p, m, skip).second;
}

Params fit(const std::vector<Row>& rows, const Gpu& g, const MathCost& m, int skip) {
  Params best;
  std::pair<double, double> best_obj{1e300, 1e300};
  for (int u = 0; u < simt::LaunchTraffic::kRoundWidths; ++u) {
    Params p;
    p.u_log2 = u;
    double* x[] = {&p.t_launch_us, &p.latency_us, &p.k_math,     &p.t_upload_us, &p.t_fetch_us,
                   &p.overlap,     &p.req_per_us, &p.wave_exp};
    auto obj = objective(rows, g, p, m, skip);
    // Coordinate search with multiplicative steps, shrinking when no step helps; three
    // rounds from the best point so far.
    for (int restart = 0; restart < 3; ++restart)
    for (double f = 2.0; f > 1.0005; f = std::sqrt(f)) {
      for (bool moved = true; moved;) {
        moved = false;
        for (double* v : x) {
          for (double step : {f, 1.0 / f}) {
            const double old = *v;
            *v = old * step;
            if ((v == &p.overlap || v == &p.wave_exp) && *v > 1.0) *v = 1.0;
            const auto o = objective(rows, g, p, m, skip);
            if (o < obj) {
              obj = o;
              moved = true;
            } else {
              *v = old;
            }
          }
        }
      }
    }
    if (obj < best_obj) {
      best_obj = obj;
      best = p;
    }
  }
  return best;
}

// ---------------------------------------------------------------- compute-bound kernels
// (issue 43; the formula is in cost_model.h)

int blocks_per_sm_regs(const Gpu& g, unsigned threads_per_block, size_t smem_bytes,
                       int regs_per_thread, const ComputeRates& r) {
  int b = blocks_per_sm(g, threads_per_block, smem_bytes);
  if (regs_per_thread > 0 && threads_per_block > 0) {
    const int warps = static_cast<int>((threads_per_block + 31) / 32);
    const int unit = r.reg_alloc_per_warp;
    const int per_warp = (regs_per_thread * 32 + unit - 1) / unit * unit;
    b = std::min(b, r.regs_per_sm / (warps * per_warp));
  }
  return std::max(b, 1);
}

namespace {

// One block's counts, as doubles (interpolated blocks are not integers).
struct BlockWork {
  double mma = 0, wgmma_macs = 0, ldsm_wf = 0, smem_wf = 0, barriers = 0, exp2 = 0, tma = 0;
};
BlockWork work_of(const simt::LaunchTraffic::BlockCounts& b) {
  return BlockWork{double(b.mma_sync), double(b.wgmma_macs), double(b.ldsm_wavefronts),
                   double(b.smem_wavefronts), double(b.barriers), double(b.calls_exp2f),
                   double(b.tma_bytes)};
}
BlockWork lerp(const BlockWork& a, const BlockWork& b, double t) {
  auto f = [t](double x, double y) { return std::max(0.0, x + (y - x) * t); };
  return BlockWork{f(a.mma, b.mma),           f(a.wgmma_macs, b.wgmma_macs),
                   f(a.ldsm_wf, b.ldsm_wf),   f(a.smem_wf, b.smem_wf),
                   f(a.barriers, b.barriers), f(a.exp2, b.exp2),
                   f(a.tma, b.tma)};
}

// Every block of the grid in launch order, as (copies, work): one entry per blockIdx.y (all
// x and z alike), interpolated over y from the blocks run; without per-block counts one entry
// of blocks_total average blocks.
std::vector<std::pair<uint64_t, BlockWork>> grid_blocks(const simt::LaunchTraffic& l) {
  std::vector<std::pair<uint64_t, BlockWork>> out;
  if (l.blocks.empty()) {
    const double n = l.blocks_run ? static_cast<double>(l.blocks_run) : 1.0;
    BlockWork w{l.mma_sync / n,        l.wgmma_macs / n, l.ldsm_wavefronts / n,
                l.smem_wavefronts / n, l.barriers / n,   l.calls_exp2f / n,
                l.tma_bytes / n};
    out.emplace_back(std::max<uint64_t>(l.blocks_total, 1), w);
    return out;
  }
  std::map<unsigned, std::pair<BlockWork, int>> by_y;  // sums and counts per y
  for (const auto& b : l.blocks) {
    auto& e = by_y[b.idx.y];
    const BlockWork w = work_of(b);
    e.first.mma += w.mma, e.first.wgmma_macs += w.wgmma_macs, e.first.ldsm_wf += w.ldsm_wf;
    e.first.smem_wf += w.smem_wf, e.first.barriers += w.barriers, e.first.exp2 += w.exp2;
    e.first.tma += w.tma;
    ++e.second;
  }
  std::vector<std::pair<double, BlockWork>> pts;  // (y, the average block of that y)
  for (auto& [y, e] : by_y) {
    const double n = e.second;
    pts.emplace_back(y, BlockWork{e.first.mma / n, e.first.wgmma_macs / n, e.first.ldsm_wf / n,
                                  e.first.smem_wf / n, e.first.barriers / n, e.first.exp2 / n,
                                  e.first.tma / n});
  }
  const unsigned gy = std::max(1u, l.grid.y);
  const uint64_t per_y = std::max<uint64_t>(1, l.blocks_total / gy);
  for (unsigned y = 0; y < gy; ++y) {
    BlockWork w;
    if (pts.size() == 1) {
      w = pts[0].second;
    } else {
      // the segment around y (the first or last one beyond the samples: extrapolated)
      size_t i = 1;
      while (i + 1 < pts.size() && pts[i].first < y) ++i;
      const auto& a = pts[i - 1];
      const auto& b = pts[i];
      w = lerp(a.second, b.second, (y - a.first) / (b.first - a.first));
    }
    out.emplace_back(per_y, w);
  }
  return out;
}

}  // namespace

ComputeTerms predict_attention_kernel(const simt::LaunchTraffic& l, const Gpu& g,
                                      const ComputeParams& p, int regs_per_thread,
                                      const ComputeRates& r) {
  ComputeTerms k;
  const int R = blocks_per_sm_regs(g, l.threads_per_block, l.smem_bytes, regs_per_thread, r);
  k.blocks_per_sm = R;
  const double e = std::max(p.e_tensor, 1e-3);
  const double ov = std::clamp(p.overlap, 0.0, 1.0);
  const int slots = g.sms * R;
  // slot free times (clocks), smallest first
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int i = 0; i < slots; ++i) free_at.push(0.0);
  double sums[5] = {0, 0, 0, 0, 0}, total = 0;
  for (const auto& [copies, w] : grid_blocks(l)) {
    const double pipes[4] = {
        w.mma * 4096.0 / (r.mma_flop_per_clk * e) + w.wgmma_macs * 2.0 / (r.wgmma_flop_per_clk * e),
        w.exp2 / r.mufu_per_clk,
        (p.alu_per_exp * w.exp2 + p.alu_per_mma * 32.0 * w.mma) / r.fp32_per_clk,
        w.ldsm_wf + w.smem_wf + w.tma / 128.0};
    double mx = 0, sm = 0;
    for (double x : pipes) mx = std::max(mx, x), sm += x;
    const double busy = mx + ov * (sm - mx);
    const double tb = R * busy + p.barrier_clk * w.barriers + p.block_clk;
    for (int i = 0; i < 4; ++i) sums[i] += copies * pipes[i];
    sums[4] += copies * p.barrier_clk * w.barriers;
    total += copies * tb;
    for (uint64_t c = 0; c < copies; ++c) {
      const double t0 = free_at.top();
      free_at.pop();
      free_at.push(t0 + tb);
    }
  }
  double end = 0;
  while (!free_at.empty()) end = std::max(end, free_at.top()), free_at.pop();
  const double clk_per_us = g.clock_ghz * 1e3;
  k.makespan_us = end / clk_per_us;
  k.imbalance = total > 0 ? end / (total / slots) : 0;
  const double per_sm = 1.0 / (g.sms * clk_per_us);
  k.t_tensor = sums[0] * per_sm, k.t_mufu = sums[1] * per_sm, k.t_alu = sums[2] * per_sm;
  k.t_smem = sums[3] * per_sm, k.t_barrier = sums[4] * per_sm;
  const double terms[4] = {k.t_tensor, k.t_mufu, k.t_alu, k.t_smem};
  const char* names[4] = {"tensor", "mufu", "alu", "smem"};
  k.bound = names[std::max_element(terms, terms + 4) - terms];
  k.t = p.t_launch_us + k.makespan_us;
  return k;
}

double predict_compute_row(const ComputeRow& r, const Gpu& g, const ComputeParams& p) {
  double t = 0;
  for (const auto& [flop, bytes] : r.gemms)
    t += p.t_launch_us +
         std::max(flop / (std::max(p.gemm_tflops, 1e-3) * 1e6), bytes / (g.copy_gbs * 1e3));
  for (const auto& [l, regs] : r.compute) t += predict_attention_kernel(l, g, p, regs).t;
  const Params mp = h200_calibration();
  const MathCost m = sm90_math_cost();
  for (size_t i = 0; i < r.memory.size(); ++i) {
    const double fp64 = i < r.memory_fp64.size() ? r.memory_fp64[i] : 0.0;
    const double t64 = fp64 / (std::max(p.k_fp64, 1e-6) * ComputeRates{}.fp64_per_clk * g.sms *
                               g.clock_ghz * 1e3);
    const simt::LaunchTraffic& l = r.memory[i];
    const double waves = static_cast<double>(l.blocks_total) /
                         (g.sms * blocks_per_sm(g, l.threads_per_block, l.smem_bytes));
    t += std::max(predict_kernel(l, g, mp, m).t, t64) +
         waves * p.mem_block_clk / (g.clock_ghz * 1e3);
  }
  return t;
}

ComputeParams h200_attention_calibration() {
  // `simt_attention_cost --refit` (2026-11-29; max_blocks 4 and 6 give the same figures) on
  // the 60 rows of the H200 measurement of 2026-11-28. At a bound of the search: e_tensor
  // and overlap (1: the pipes add up, at the 2/3 mma.sync rate), barrier_clk (0: barriers
  // scale with the tiles, as the block's other costs do, so the fit cannot tell them apart)
  // and gemm_tflops (the dense peak: every baseline GEMM here is bound by its bytes).
  ComputeParams p;
  p.e_tensor = 1.0;
  p.alu_per_exp = 9.19490293;
  p.alu_per_mma = 8.58347894;
  p.overlap = 1.0;
  p.barrier_clk = 1e-06;
  p.block_clk = 13711.778;
  p.gemm_tflops = 989.4;
  p.k_fp64 = 0.551191292;
  p.mem_block_clk = 6512.10969;
  p.t_launch_us = 3.0;
  return p;
}

ComputeParams fit_compute(const std::vector<ComputeRow>& rows, const Gpu& g, int skip,
                          const ComputeParams& start, double first_step) {
  auto obj = [&](const ComputeParams& p) {
    double ss = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (static_cast<int>(i) == skip || rows[i].measured_us <= 0 || !rows[i].excluded.empty())
        continue;
      const double e = std::log(predict_compute_row(rows[i], g, p) / rows[i].measured_us);
      ss += e * e;
    }
    return ss;
  };
  ComputeParams p = start;
  double* x[] = {&p.e_tensor,    &p.alu_per_exp, &p.alu_per_mma, &p.overlap,
                 &p.barrier_clk, &p.block_clk,   &p.gemm_tflops, &p.k_fp64,
                 &p.mem_block_clk};
  double best = obj(p);
  // coordinate search with multiplicative steps, shrinking when no step helps
  for (int restart = 0; restart < 2; ++restart)
    for (double f = std::max(first_step, 1.003); f > 1.002; f = std::sqrt(f)) {
      for (bool moved = true; moved;) {
        moved = false;
        for (double* v : x) {
          for (double step : {f, 1.0 / f}) {
            const double old = *v;
            *v = std::max(old * step, 1e-6);
            if ((v == &p.overlap || v == &p.e_tensor) && *v > 1.0) *v = 1.0;
            if (v == &p.gemm_tflops && *v > 989.4) *v = 989.4;  // the dense BF16 peak
            const double o = obj(p);
            if (o < best - 1e-12) {
              best = o;
              moved = true;
            } else {
              *v = old;
            }
          }
        }
      }
    }
  return p;
}

}  // namespace st::cost
