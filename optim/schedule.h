// Learning-rate schedule: linear warm-up from 0 to lr over warmup_steps, then cosine
// decay to min_lr at max_steps (constant min_lr after).
#pragma once

namespace st {

struct LrSchedule {
  float lr = 6e-4f;
  float min_lr = 6e-5f;
  int warmup_steps = 0;
  int max_steps = 1;
  // step is 0-based: the learning rate used by the (step+1)-th update.
  float at(int step) const;
};

}  // namespace st
