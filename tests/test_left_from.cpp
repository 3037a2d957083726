// The ETA's count of the hook steps still to come (train/step_loop.cpp, left_from):
// HookSchedule::hook_steps_after, a closed form, against the loop over is_hook_step it
// replaced, over many schedules (hooks.every, train.ckpt_every, train.max_steps) and every
// starting step, edge cases included.
#include <gtest/gtest.h>

#include <cstdint>

#include "train/config.h"
#include "train/hooks.h"

namespace st {
namespace {

// What left_from counted before: one is_hook_step per step in (after, max_steps].
int64_t loop_count(const HookSchedule& h, int64_t after) {
  int64_t n = 0;
  for (int64_t k = after + 1; k <= h.max_steps; ++k) n += h.is_hook_step(k);
  return n;
}

TEST(HookSchedule, ClosedFormCountEqualsTheLoopOverEverySmallSchedule) {
  int64_t cases = 0;
  for (int64_t max_steps = 0; max_steps <= 40; ++max_steps)
    for (int64_t every = -1; every <= 13; ++every)
      for (int64_t ckpt = -1; ckpt <= 13; ++ckpt) {
        const HookSchedule h{every, ckpt, max_steps};
        for (int64_t after = -3; after <= max_steps + 2; ++after, ++cases)
          ASSERT_EQ(h.hook_steps_after(after), loop_count(h, after))
              << "every " << every << ", ckpt_every " << ckpt << ", max_steps " << max_steps
              << ", after step " << after;
      }
  EXPECT_GT(cases, 200000);
}

TEST(HookSchedule, ClosedFormCountEqualsTheLoopOnLongRuns) {
  // Periods equal, nested, coprime, sharing a factor, longer than the run, and one step;
  // max_steps a multiple of them or not; starts at 0, in the middle, at the last step.
  const int64_t periods[][2] = {{100, 200}, {200, 100}, {100, 100}, {7, 11},  {6, 10},
                                {1, 0},     {1, 1},     {0, 5},     {3, 0},   {99999, 7},
                                {25000, 100000},        {100003, 100003}};
  for (const int64_t max_steps : {int64_t{1}, int64_t{999}, int64_t{100000}, int64_t{100003}})
    for (const auto& p : periods) {
      const HookSchedule h{p[0], p[1], max_steps};
      for (const int64_t after : {int64_t{0}, int64_t{1}, max_steps / 3, max_steps / 2 + 1,
                                  max_steps - 1, max_steps})
        ASSERT_EQ(h.hook_steps_after(after), loop_count(h, after))
            << "every " << p[0] << ", ckpt_every " << p[1] << ", max_steps " << max_steps
            << ", after step " << after;
    }
}

TEST(HookSchedule, TakesItsPeriodsFromTheConfig) {
  Config c;
  c.hooks.every = 5;
  c.train.ckpt_every = 7;
  c.train.max_steps = 30;
  const HookSchedule h = HookSchedule::of(c);
  EXPECT_EQ(h.every, 5);
  EXPECT_EQ(h.ckpt_every, 7);
  EXPECT_EQ(h.max_steps, 30);
  // Hook steps after step 0: 5 10 15 20 25 30 (every), 7 14 21 28 (checkpoints).
  EXPECT_EQ(h.hook_steps_after(0), 10);
  EXPECT_EQ(h.hook_steps_after(28), 1);
  EXPECT_EQ(h.hook_steps_after(30), 0);
  c.hooks.every = 0;  // hooks off: no hook step, checkpoints or not
  EXPECT_EQ(HookSchedule::of(c).hook_steps_after(0), 0);
}

}  // namespace
}  // namespace st
