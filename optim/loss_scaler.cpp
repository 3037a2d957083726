#include "optim/loss_scaler.h"

#include <algorithm>

namespace st {

bool LossScaler::update(bool grads_finite) {
  if (!cfg_.enabled) return !grads_finite;
  if (!grads_finite) {
    scale_ = std::max(cfg_.min_scale, scale_ * 0.5f);
    good_ = 0;
    return true;
  }
  if (++good_ >= cfg_.growth_interval) {
    scale_ = std::min(cfg_.max_scale, scale_ * 2.0f);
    good_ = 0;
  }
  return false;
}

}  // namespace st
