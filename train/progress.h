// Progress lines of a run (header-only): when the one "timing:" line with the measured time
// per step and the ETA is due (Run::go), how it reads, the ETA of the periodic step lines
// (RecentEta), and the at-most-every-5-s progress lines of a slow hook (train/hooks.cpp).
// Times are passed in, so the decisions are tested without clocks (tests/test_startup.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>

namespace st {

// "6 h 41 min", "3 min 12 s", "45 s", "?" (negative or not finite).
inline std::string format_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[48];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld h %ld min", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ld min %ld s", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld s", t);
  return buf;
}

// 9997 -> "9,997".
inline std::string group_thousands(int64_t n) {
  std::string d = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return (n < 0 ? "-" : "") + out;
}

// The measured time per training step, printed once: the steps after the invocation's
// first two (allocation and warm-up), hook steps and the steps run.threads auto spends
// trying thread counts left out (they carry the hooks' cost, or run at a count the run will
// not keep), due once at least kMinSteps steps were measured and kMinSeconds passed since
// the loop began.
class StepTiming {
 public:
  static constexpr int kMinSteps = 3;
  static constexpr double kMinSeconds = 10.0;
  explicit StepTiming(int64_t first_step, double min_seconds = kMinSeconds)
      : first_(first_step), min_seconds_(min_seconds) {}
  // Step s (counted after its update) took dt seconds; excluded: a hook step or a thread-
  // count probe step; since_start: the seconds since the loop began. True exactly once:
  // when the line is due.
  bool add(int64_t s, double dt, bool excluded, double since_start) {
    if (done_) return false;
    if (s > first_ + 2 && !excluded) {
      if (n_ == 0) from_ = s;
      to_ = s;
      ++n_;
      sum_ += dt;
    }
    if (n_ >= kMinSteps && since_start >= min_seconds_) {
      done_ = true;
      return true;
    }
    return false;
  }
  double per_step() const { return n_ ? sum_ / n_ : 0.0; }
  int64_t from() const { return from_; }
  int64_t to() const { return to_; }
  int steps() const { return n_; }

 private:
  int64_t first_, from_ = 0, to_ = 0;
  double min_seconds_, sum_ = 0;
  int n_ = 0;
  bool done_ = false;
};

// "timing: 2.41 s/step over steps 3-5 (3 steps); 9,995 steps left -> ETA 6 h 41 min
// (excluding evaluation, checkpoints and hook steps)".
inline std::string timing_line(const StepTiming& t, int64_t steps_left) {
  char buf[96];
  const double ps = t.per_step();
  if (ps >= 0.1)
    std::snprintf(buf, sizeof buf, "%.2f s/step", ps);
  else
    std::snprintf(buf, sizeof buf, "%.1f ms/step", ps * 1e3);
  return "timing: " + std::string(buf) + " over steps " + std::to_string(t.from()) + "-" +
         std::to_string(t.to()) + " (" + std::to_string(t.steps()) + " steps); " +
         group_thousands(steps_left) + " steps left -> ETA " +
         format_eta(ps * static_cast<double>(steps_left)) +
         " (excluding evaluation, checkpoints and hook steps)";
}

// The ETA of the periodic step lines (train.log_every), from what the run really spends and
// recently: a user saw "ETA 2m34" with 11 minutes left when the ETA was the mean training
// step of the whole invocation times the steps left (evaluation, checkpoints and hook steps
// left out; a machine that got busier not seen). Here
//   ETA = ordinary steps left x their mean time over a recent window
//       + hook steps left x the last hook step's time
//       + evaluations left x the last evaluation's time
//       + checkpoints left x the last checkpoint's time.
// The window holds the latest ordinary steps (not hook steps, not the invocation's first
// two: allocation and warm-up) ending within kWindowSeconds of the newest one, and at least
// the last kWindowSteps of them, so a slowdown shows within about a minute (or 50 steps)
// while a few fast steps do not swing it. Evaluation, checkpoints and hook steps recur less
// often than the window turns over, so they are counted by their last occurrence and the
// number the schedule still holds; until one was seen, a hook step counts as an ordinary
// step and an evaluation or a checkpoint as 0 s.
class RecentEta {
 public:
  static constexpr int kWindowSteps = 50;
  static constexpr double kWindowSeconds = 60.0;
  struct Left {
    int64_t steps = 0, hook_steps = 0, evals = 0, checkpoints = 0;
  };
  explicit RecentEta(int64_t first_step) : first_(first_step) {}
  // Step s's training part (hooks included) ended at `now` (seconds, any monotonic clock)
  // and took step_s.
  void step(int64_t s, double now, double step_s, bool hook_step) {
    if (hook_step) {
      last_hook_ = step_s;
      return;
    }
    if (s <= first_ + 2) return;
    window_.push_back({now, step_s});
    while (static_cast<int>(window_.size()) > kWindowSteps &&
           now - window_.front().end > kWindowSeconds)
      window_.pop_front();
  }
  void evaluation(double seconds) { last_eval_ = seconds; }
  void checkpoint(double seconds) { last_ckpt_ = seconds; }
  // Seconds per ordinary step over the window; 0 before one was measured.
  double per_step() const {
    double sum = 0;  // summed afresh: a running sum would drift as steps leave the window
    for (const Point& p : window_) sum += p.seconds;
    return window_.empty() ? 0.0 : sum / static_cast<double>(window_.size());
  }
  int window_steps() const { return static_cast<int>(window_.size()); }
  // Negative while no ordinary step was measured (printed "?").
  double eta(const Left& left) const {
    if (window_.empty()) return -1;
    const double ps = per_step();
    const double hook = last_hook_ > 0 ? last_hook_ : ps;
    return static_cast<double>(left.steps - left.hook_steps) * ps +
           static_cast<double>(left.hook_steps) * hook +
           static_cast<double>(left.evals) * last_eval_ +
           static_cast<double>(left.checkpoints) * last_ckpt_;
  }

 private:
  struct Point {
    double end, seconds;
  };
  int64_t first_;
  std::deque<Point> window_;
  double last_hook_ = 0, last_eval_ = 0, last_ckpt_ = 0;
};

// Progress of a slow hook: due when the hook has run for at least `after` seconds and the
// last line is at least `every` seconds old.
class SlowProgress {
 public:
  explicit SlowProgress(double after = 5.0, double every = 5.0) : after_(after), every_(every) {}
  bool due(double elapsed) {
    if (elapsed < after_ || elapsed - last_ < every_) return false;
    last_ = elapsed;
    return true;
  }

 private:
  double after_, every_, last_ = -1e300;
};

}  // namespace st
