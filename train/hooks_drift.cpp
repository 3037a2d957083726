// The hooks' running diagnostics (train/hooks_drift.h): Qiu & Yao's delta drift
// (DeltaDriftTracker: the run's attention backward against an FP64 recompute, running sums
// and previous error directions) and the spike detector's running z-score (SpikeDetector).
// Both keep state that StabilityHooks saves in checkpoints.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "attention/head_cpu.h"
#include "core/error.h"
#include "train/hooks_drift.h"
#include "train/hooks_internal.h"

namespace st {

using detail::norm2;

// ---------------------------------------------------------------------------------------
// Spike detector

ZScore SpikeDetector::score(double x) const {
  ZScore z;
  const size_t n = vals_.size();
  if (n < static_cast<size_t>(std::max(warmup_, 2)) || !std::isfinite(x)) return z;
  double mean = 0;
  for (double v : vals_) mean += v;
  mean /= static_cast<double>(n);
  double var = 0;
  for (double v : vals_) var += (v - mean) * (v - mean);
  var /= static_cast<double>(n);
  z.mean = mean;
  z.std = std::sqrt(var);
  if (!(z.std > 0)) return z;
  z.valid = true;
  z.z = (x - mean) / z.std;
  return z;
}

void SpikeDetector::push(double x) {
  if (!std::isfinite(x)) return;
  vals_.push_back(x);
  if (static_cast<int>(vals_.size()) > window_) vals_.erase(vals_.begin());
}

// ---------------------------------------------------------------------------------------
// Delta drift

DeltaDriftTracker::DeltaDriftTracker(int n_layer, int n_head, int n_embd)
    : L_(n_layer), NH_(n_head), C_(n_embd),
      cum_(static_cast<size_t>(n_layer) * n_head, 0.0),
      prev_(static_cast<size_t>(n_layer) * n_head) {}

std::vector<DriftRow> DeltaDriftTracker::layer(int l, const AttentionConfig& run, DType fmt,
                                               int B, int T, const double* Qkv,
                                               const double* dO, const double* X, int R,
                                               double unscale) {
  ST_CHECK(l >= 0 && l < L_ && R >= 0 && R <= B, "delta drift: layer ", l, ", rows ", R);
  const int NH = NH_, C = C_, hs = C / NH;
  AttentionConfig ref;  // FP64 baseline: every rounding point FP64
  ref.kind = AttentionKind::Baseline;
  ref.causal = run.causal;
  std::vector<DriftRow> out(NH);
  const size_t C3 = 3 * static_cast<size_t>(C), n = static_cast<size_t>(T) * hs;
#pragma omp parallel for schedule(dynamic)
  for (int h = 0; h < NH; ++h) {
    const AttnNumerics nr = run.numerics(fmt, h), n64 = ref.numerics(DType::F64, h);
    std::vector<double> q(n), k(n), v(n), g(n), dq(n), dq64(n), dk(n), dv(n);
    std::vector<double> E(static_cast<size_t>(hs) * C, 0.0), G(E.size(), 0.0);
    DriftRow& o = out[h];
    o.layer = l;
    o.head = h;
    for (int b = 0; b < R; ++b) {
      for (int t = 0; t < T; ++t) {
        const double* row = Qkv + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
        const double* grow = dO + (static_cast<size_t>(b) * T + t) * C + h * hs;
        for (int j = 0; j < hs; ++j) {
          q[t * hs + j] = row[j];
          k[t * hs + j] = row[C + j];
          v[t * hs + j] = row[2 * C + j];
          g[t * hs + j] = grow[j];
        }
      }
      HeadForward fr, f64;
      head_forward(run, nr, T, hs, q.data(), k.data(), v.data(), fr);
      head_forward(ref, n64, T, hs, q.data(), k.data(), v.data(), f64);
      const auto d_run = head_deltas(run, nr, T, hs, q.data(), k.data(), v.data(), fr, g.data());
      const auto d_64 = head_deltas(ref, n64, T, hs, q.data(), k.data(), v.data(), f64, g.data());
      for (int t = 0; t < T; ++t) {
        o.drift += d_run[t] - d_64[t];
        o.abs_err += std::abs(d_run[t] - d_64[t]);
      }
      head_backward(run, nr, T, hs, q.data(), k.data(), v.data(), fr, g.data(), dq.data(),
                    dk.data(), dv.data());
      head_backward(ref, n64, T, hs, q.data(), k.data(), v.data(), f64, g.data(), dq64.data(),
                    dk.data(), dv.data());
      // dW_Q (hs x C) = sum over rows of dQ[t]^T ln1[t]: its error and the FP64 reference.
      for (int t = 0; t < T; ++t) {
        const double* x = X + (static_cast<size_t>(b) * T + t) * C;
        for (int i = 0; i < hs; ++i) {
          const double e = dq[t * hs + i] - dq64[t * hs + i], r = dq64[t * hs + i];
          double* Ei = E.data() + static_cast<size_t>(i) * C;
          double* Gi = G.data() + static_cast<size_t>(i) * C;
          for (int c = 0; c < C; ++c) {
            Ei[c] += e * x[c];
            Gi[c] += r * x[c];
          }
        }
      }
    }
    o.drift *= unscale;
    o.abs_err *= unscale;
    const double en = norm2(E), gn = norm2(G);
    o.dwq_err = en * unscale;
    if (gn > 0) o.dwq_rel = en / gn;
    std::vector<double>& prev = prev_[static_cast<size_t>(l) * NH + h];
    if (en > 0) {
      for (auto& e : E) e /= en;
      if (prev.size() == E.size()) {
        double dot = 0;
        for (size_t i = 0; i < E.size(); ++i) dot += E[i] * prev[i];
        o.cos_prev = dot;
      }
      prev = std::move(E);
    }
  }
  for (int h = 0; h < NH; ++h) out[h].cum = cum_[static_cast<size_t>(l) * NH + h] += out[h].drift;
  return out;
}

}  // namespace st
