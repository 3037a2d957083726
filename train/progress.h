// Progress lines of a run (header-only): when the one "timing:" line with the measured time
// per step and the ETA is due (Run::go), how it reads, and the at-most-every-5-s progress
// lines of a slow hook (train/hooks.cpp). Times are passed in, so the decisions are tested
// without clocks (tests/test_progress.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
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
