// Stability instrumentation of a training run (config section `hooks`; file formats in
// docs/run_files.md):
//   spectral.csv     largest singular value of every weight matrix and per-head attention
//                    slice, by power iteration warm-started from the previous hook's vectors
//   grad_norms.csv   gradient L2 norm of every slice
//   attn_stats.csv   attention statistics (max logit, tied maxima, P = 1 count, entropy)
//   delta_drift.csv  Qiu & Yao's diagnostic: the backward's delta and the W_Q gradient of
//                    the run's attention against an FP64 recompute of the same inputs
//   wasserstein.csv  W1 / max |dW| against hooks.reference_run's same-step checkpoint
//   events.jsonl     loss / grad-norm spikes (running z-score) and what was done about them
// Hook steps: every hooks.every steps and every checkpoint step (spectral norms also at
// step 0 of a fresh run). The hooks never change the training arithmetic (except the
// opt-in spike skip): they read weights, gradients and activations and write files. Their
// own state (power vectors, running sums, the spike window) is saved in checkpoints, so a
// resumed run writes the same lines as a run that never stopped.
#pragma once
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "analysis/slices.h"
#include "model/gpt2.h"
#include "train/config.h"

namespace st {

// Largest singular value of a slice of `flat` by power iteration on A^T A, starting from
// `v` (resized and seeded deterministically when empty or of the wrong size) and leaving
// the final right singular vector estimate in it. Stops when the relative residual
// ||A^T A v - rho v|| / rho is at most tol or after max_iters iterations. A cold start (v
// empty) of a matrix with a short side <= 512 first iterates on the small Gram matrix
// (A^T A or A A^T), which costs one pass over A instead of hundreds; its iterations count
// towards max_iters and iters. FP64 arithmetic; the result does not
// depend on the number of threads.
struct PowerResult {
  double sigma = 0;
  int iters = 0;
  bool converged = false;
};
PowerResult spectral_norm(const WeightSlice& s, const float* flat, std::vector<double>& v,
                          double tol, int max_iters, uint64_t seed = 0);

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
  void set_values(std::vector<double> v) { vals_ = std::move(v); }

 private:
  int window_, warmup_;
  std::vector<double> vals_;  // oldest first, at most window_
};

struct SpikeDecision {
  bool spike = false;
  bool snapshot = false, skip = false;
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

// hooks.reference_run (when set) must be a run directory of a model of the same shape;
// throws naming the key and the config file otherwise.
void check_reference_run(const Config& cfg);

class StabilityHooks {
 public:
  StabilityHooks(const Config& cfg, GPT2& model, const std::string& run_dir,
                 std::shared_ptr<spdlog::logger> log);
  ~StabilityHooks();
  bool enabled() const { return cfg_.every > 0; }
  // Is step s (counted after its update, as in metrics.jsonl) a hook step?
  bool is_hook_step(int64_t s) const;

  // Resume: drop lines of steps after `step` from the hook files and restore the state
  // saved in the checkpoint (empty: a checkpoint written without hooks).
  void resume(int64_t step, const std::vector<uint8_t>& state);
  std::vector<uint8_t> state() const;

  // Fresh run, before the first step: spectral norms of the initial weights (step 0).
  void at_start();
  // Before the forward passes of step s: collect attention statistics on hook steps.
  void begin_step(int64_t s);
  // Before the backward of step s's last micro-batch: the delta-drift recompute runs
  // inside that backward (GPT2 attention observer) on hook steps.
  void before_last_backward(int64_t s);
  // After step s's backward, before its update: gradient norms and attention statistics.
  void after_backward(int64_t s);
  // Spike check on step s's loss and gradient norm (before the update).
  SpikeDecision check_spike(int64_t s, double loss, double grad_norm);
  // After step s's update: spectral norms.
  void after_update(int64_t s);
  // At a checkpoint of step s: distances to the reference run's same-step checkpoint.
  void at_checkpoint(int64_t s);
  // Appends one line to events.jsonl: {"step": s, "event": name, ...fields}.
  void event(int64_t s, const std::string& name, const nlohmann::ordered_json& fields = {});

  double seconds() const { return seconds_; }  // wall time spent in the hooks

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  HooksSection cfg_;
  double seconds_ = 0, step_start_seconds_ = 0;
};

}  // namespace st
