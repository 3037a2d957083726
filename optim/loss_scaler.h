// Dynamic loss scaling for FP16 training: the loss gradient is multiplied by `scale`;
// a step whose gradients hold Inf/NaN is skipped and the scale halved; after
// growth_interval clean steps in a row the scale doubles.
#pragma once

namespace st {

struct LossScalerConfig {
  bool enabled = false;  // the model turns it on for fp16
  float init_scale = 65536.0f;
  int growth_interval = 2000;
  float min_scale = 1.0f;
  float max_scale = 16777216.0f;  // 2^24
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& c = {}) : cfg_(c), scale_(c.enabled ? c.init_scale : 1.0f) {}
  bool enabled() const { return cfg_.enabled; }
  float scale() const { return scale_; }
  // Record the outcome of a step; returns true when the update must be skipped.
  bool update(bool grads_finite);
  // Checkpoint state.
  int good_steps() const { return good_; }
  void set_state(float scale, int good_steps) {
    scale_ = scale;
    good_ = good_steps;
  }

 private:
  LossScalerConfig cfg_;
  float scale_;
  int good_ = 0;
};

}  // namespace st
