#include "optim/schedule.h"

#include <cmath>

namespace st {

float LrSchedule::at(int step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (step >= max_steps) return min_lr;
  const int span = max_steps - warmup_steps;
  if (span <= 0) return lr;
  const double ratio = static_cast<double>(step - warmup_steps) / span;
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return static_cast<float>(min_lr + coeff * (lr - min_lr));
}

}  // namespace st
