// CPU threading (backends/cpu_threads.h).
#include "backends/cpu_threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" void openblas_set_num_threads(int);

namespace st {
namespace {

// What the .preinit_array entry found and did (environment changes made there are not
// visible to getenv in main, so the outcome is kept here).
char g_policy[96] = "";

void set_wait_policy(int, char**, char**) {
  const char* user = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (user && *user) {
    std::snprintf(g_policy, sizeof g_policy, "%s (from OMP_WAIT_POLICY)", user);
  } else if (spin && *spin) {
    std::snprintf(g_policy, sizeof g_policy, "spin count %s (from GOMP_SPINCOUNT)", spin);
  } else {
    setenv("OMP_WAIT_POLICY", "passive", 0);
    std::snprintf(g_policy, sizeof g_policy, "passive (stabletrain's default)");
  }
}

}  // namespace
}  // namespace st

// Runs before the shared libraries' initialisers, so libgomp reads the policy set here. It
// is linked into every executable through omp_wait_policy_description() (the CPU backend
// calls it).
__attribute__((section(".preinit_array"), used)) static void (*st_preinit_wait_policy)(
    int, char**, char**) = &st::set_wait_policy;

namespace st {

std::string omp_wait_policy_description() {
  return g_policy[0] ? g_policy : "OpenMP's default (set before stabletrain could)";
}

int cpu_cores_available() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, omp_get_num_procs());
}

void set_cpu_threads(int threads) {
  openblas_set_num_threads(1);
  if (threads > 0 && threads != omp_get_max_threads()) omp_set_num_threads(threads);
}

int cpu_threads() { return omp_get_max_threads(); }

// ---------------------------------------------------------------------------------------
// ThreadTuner

namespace {
constexpr int kProbeSteps = 3;     // steps per candidate in a probe pass
constexpr int kProbeDiscard = 1;   // the first is a warm-up (threads waking, caches)
constexpr double kAbort = 2.0;     // a candidate this much slower than the pass's best so far
                                   // is dropped after one step
constexpr int kWindow = 5;         // settled steps whose median is watched
constexpr int kMinSettled = 10;    // settled steps before a change of load may trigger a probe
constexpr double kDrift = 1.5;     // ... when the median moves by this factor

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g s", s);
  return b;
}
}  // namespace

ThreadTuner::ThreadTuner(std::vector<int> candidates, int reprobe_every)
    : cand_(std::move(candidates)), reprobe_every_(std::max(1, reprobe_every)) {
  if (cand_.empty()) cand_ = {1};
  time_.assign(cand_.size(), 0.0);
  start_probe(0);
}

void ThreadTuner::start_probe(int first) {
  order_.clear();
  order_.push_back(first);  // the current choice first: a fresh reference for the others
  for (int i = 0; i < static_cast<int>(cand_.size()); ++i)
    if (i != first) order_.push_back(i);
  probing_ = cand_.size() > 1 ? 0 : -1;
  best_ = first;
  current_ = cand_[first];
  steps_in_probe_ = 0;
  probe_acc_ = 0;
  pass_best_ = 0;
  if (probing_ < 0) settled_ref_ = 0;
}

bool ThreadTuner::record(double seconds, std::string* why) {
  if (probing_ < 0) {  // settled: watch for a change of load
    ++since_probe_;
    window_.push_back(seconds);
    if (window_.size() > kWindow) window_.erase(window_.begin());
    const double m = window_.size() == kWindow ? median(window_) : settled_ref_;
    const bool drift = since_probe_ >= kMinSettled &&
                       (m > kDrift * settled_ref_ || m * kDrift < settled_ref_);
    if (cand_.size() > 1 && (drift || since_probe_ >= reprobe_every_)) start_probe(best_);
    return false;
  }
  const int k = order_[probing_];
  ++steps_in_probe_;
  bool done = false;
  if (steps_in_probe_ == 1 && pass_best_ > 0 && seconds > kAbort * pass_best_) {
    time_[k] = seconds;  // clearly slower: no need for more steps of it
    done = true;
  } else {
    if (steps_in_probe_ > kProbeDiscard) probe_acc_ += seconds;
    if (steps_in_probe_ == kProbeSteps) {
      time_[k] = probe_acc_ / (kProbeSteps - kProbeDiscard);
      pass_best_ = pass_best_ > 0 ? std::min(pass_best_, time_[k]) : time_[k];
      done = true;
    }
  }
  if (!done) return false;
  steps_in_probe_ = 0;
  probe_acc_ = 0;
  if (++probing_ < static_cast<int>(order_.size())) {
    current_ = cand_[order_[probing_]];
    return false;
  }
  probing_ = -1;
  const int prev = decided_ ? best_ : -1;
  best_ = static_cast<int>(std::min_element(time_.begin(), time_.end()) - time_.begin());
  current_ = cand_[best_];
  settled_ref_ = time_[best_];
  since_probe_ = 0;
  window_.clear();
  decided_ = true;
  if (best_ == prev) return false;
  if (why) {
    std::string s = prev < 0 ? "" : std::to_string(cand_[prev]) + " -> ";
    s += std::to_string(current_) + " threads (s/step:";
    for (size_t i = 0; i < cand_.size(); ++i)
      s += (i ? ", " : " ") + fmt_s(time_[i]) + " at " + std::to_string(cand_[i]);
    *why = s + ")";
  }
  return true;
}

std::vector<int> thread_candidates(int cores) {
  std::vector<int> c;
  for (int n = std::max(1, cores); n >= 1; n = n > 4 ? n / 2 : n - 1) c.push_back(n);
  return c;  // all cores first (the usual answer on a quiet machine), then fewer
}

}  // namespace st
