// The hooks' running diagnostics (implemented in train/hooks_drift.cpp; included by
// train/hooks.h): the spike detector's running z-score and Qiu & Yao's delta drift.
#pragma once
#include <cmath>
#include <utility>
#include <vector>

#include "core/attention.h"
#include "core/dtype.h"

namespace st {

// Running z-score of a series over the last `window` values (population standard
// deviation); a value is a spike when at least `warmup` values were seen before it and
// (x - mean) / std exceeds the threshold.
struct ZScore {
  bool valid = false;  // enough values and std > 0
  double z = 0, mean = 0, std = 0;
};
class SpikeDetector {
 public:
  SpikeDetector(int window = 100, int warmup = 20) : window_(window), warmup_(warmup) {}
  ZScore score(double x) const;  // x against the window before it
  void push(double x);  // non-finite values are not added
  const std::vector<double>& values() const { return vals_; }
  // A checkpoint's window; a longer one than `window` (the setting was lowered on resume)
  // keeps its newest values.
  void set_values(std::vector<double> v) {
    if (static_cast<int>(v.size()) > window_) v.erase(v.begin(), v.end() - window_);
    vals_ = std::move(v);
  }

 private:
  int window_, warmup_;
  std::vector<double> vals_;  // oldest first, at most window_
};

// Qiu & Yao's diagnostic (delta_drift.csv, docs/run_files.md): per layer and head, the
// backward's delta and the W_Q gradient of the run's attention against an FP64 recompute
// from the same Q, K, V, dO; keeps the running sums and the previous error directions.
struct DriftRow {
  int layer = 0, head = 0;
  double drift = 0;      // sum over rows of (delta_run - delta_fp64)
  double cum = 0;        // running sum of drift over the calls so far
  double abs_err = 0;    // sum over rows of |delta_run - delta_fp64|
  double dwq_err = 0;    // ||dW_Q,run - dW_Q,fp64||_F
  double dwq_rel = NAN;  // dwq_err / ||dW_Q,fp64||_F (NaN when the reference is 0)
  double cos_prev = NAN; // cosine with the previous call's error direction (NaN: none)
};
class DeltaDriftTracker {
 public:
  DeltaDriftTracker(int n_layer, int n_head, int n_embd);
  // One layer: qkv (B, T, 3C), dout (B, T, C) and ln1 (B, T, C) in FP64, row-major, of
  // which the first `rows` sequences are used. `unscale` multiplies the delta and dW
  // figures (1 / loss scale). Heads run in parallel; results do not depend on threads.
  std::vector<DriftRow> layer(int layer, const AttentionConfig& run, DType fmt, int B, int T,
                              const double* qkv, const double* dout, const double* ln1,
                              int rows, double unscale = 1.0);
  // State for checkpoints.
  std::vector<double>& cum() { return cum_; }
  std::vector<std::vector<double>>& prev() { return prev_; }

 private:
  int L_, NH_, C_;
  std::vector<double> cum_;                // (L * NH)
  std::vector<std::vector<double>> prev_;  // (L * NH) unit error direction, or empty
};

}  // namespace st
