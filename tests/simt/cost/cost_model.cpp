// The cost model of memory-bound kernels (cost_model.h).
#include "simt/cost/cost_model.h"

#include <algorithm>
#include <cmath>

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

}  // namespace st::cost
