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
#include <memory>
#include <string>
#include <vector>

#include "analysis/slices.h"
#include "model/gpt2.h"
#include "train/config.h"
#include "train/hooks_drift.h"
#include "train/hooks_spectral.h"

namespace st {

struct SpikeDecision {
  bool spike = false;
  bool snapshot = false, skip = false;
};

// When the hooks run: every `every` steps (hooks.every), at every checkpoint step
// (train.ckpt_every) and at the run's last step (train.max_steps); never when every is 0.
// Steps are counted after their update, as in metrics.jsonl.
struct HookSchedule {
  int64_t every = 0, ckpt_every = 0, max_steps = 0;
  static HookSchedule of(const Config& cfg);
  bool is_hook_step(int64_t s) const;
  // How many steps in (after, max_steps] are hook steps: the count of is_hook_step over
  // them, in closed form (the progress line's ETA asks on every log line).
  int64_t hook_steps_after(int64_t after) const;
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
  bool is_hook_step(int64_t s) const { return schedule_.is_hook_step(s); }
  const HookSchedule& schedule() const { return schedule_; }

  // Resume: drop lines of steps after `step` from the hook files and restore the state
  // saved in the checkpoint (empty: a checkpoint written without hooks).
  void resume(int64_t step, const std::vector<uint8_t>& state);
  std::vector<uint8_t> state() const;

  // Fresh run, before the first step: spectral norms of the initial weights (step 0).
  void at_start();
  // Before the forward passes of step s: collect attention statistics on hook steps.
  void begin_step(int64_t s);
  // Before the forward_backward of step s's last micro-batch: the delta-drift recompute
  // runs inside that backward (GPT2 attention observer) on hook steps.
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
  HookSchedule schedule_;
  double seconds_ = 0, step_start_seconds_ = 0;
};

}  // namespace st
