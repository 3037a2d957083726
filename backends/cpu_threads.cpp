// CPU threading (backends/cpu_threads.h).
#include "backends/cpu_threads.h"

#include <malloc.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_corename();
extern "C" char* openblas_get_config();

namespace st {
namespace {

// The wait policy must be in the environment when libgomp's ELF initialiser reads it, which
// is before any code of ours runs except a .preinit_array entry, and a variable set there is
// lost: glibc's environ is not set up yet (getenv finds nothing) and libc's initialiser then
// points it back at the process's original block (until 2026-11-28 stabletrain did that, and
// its executables ran with libgomp's spin count of 300,000 while the log said "passive").
// So the executable's first constructor adds the default and re-executes the same program
// with the same arguments (/proc/self/exe: same pid; one more start of the program and its
// libraries: `train --help` took 0.06-0.11 s against 0.02-0.06 s without, under load). The marker
// records what was set, so the new image and any child process do not re-execute, and can
// tell a default of ours from a user's setting; any value of it present at start opts out.
constexpr const char* kMarker = "STABLETRAIN_RUNTIME_ENV";
constexpr const char* kOurs = "OMP_WAIT_POLICY=passive";  // the marker when the policy is ours

bool is_set(const char* var) {
  const char* v = std::getenv(var);
  return v && *v;
}

// glibc's malloc serves a block of 128 KiB or more by mmap, but raises that threshold to the
// size of each such block freed (up to 32 MiB), after which freed blocks stay in the heap
// and in RSS: the default run peaked at 462-491 MiB with it, 373 MiB without (2026-11-28).
// A training step allocates no large block (bench step: 7-20 page faults per step), only
// hook, evaluation and sampling steps do, so a fixed 1 MiB threshold costs no speed and
// makes the peak what the memory estimate counts. MALLOC_MMAP_THRESHOLD_ in the environment
// wins.
constexpr int kMmapThreshold = 1 << 20;

void apply_runtime_defaults(int, char** argv, char**) {
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  if (std::getenv(kMarker)) return;  // set by us before the re-exec, by a parent, or by the user
  if (is_set("OMP_WAIT_POLICY") || is_set("GOMP_SPINCOUNT") || !argv || !argv[0]) {
    setenv(kMarker, "none", 1);
    return;
  }
  setenv("OMP_WAIT_POLICY", "passive", 1);
  setenv(kMarker, kOurs, 1);
  execv("/proc/self/exe", argv);
  // Still here: the setting did not reach libgomp. Say so; omp_wait_policy_description()
  // then names what really runs.
  std::fprintf(stderr, "stabletrain: could not re-execute with %s (/proc/self/exe: %s); running "
               "with OpenMP's default wait policy\n", kOurs, std::strerror(errno));
  unsetenv("OMP_WAIT_POLICY");
  setenv(kMarker, "none", 1);
}

}  // namespace
}  // namespace st

// Before every other constructor of the executable (priority 101; the shared libraries'
// initialisers have run). Linked into every executable through omp_wait_policy_description()
// (the CPU backend calls it). glibc passes argc, argv and envp to constructors.
__attribute__((constructor(101))) static void st_runtime_defaults(int argc, char** argv,
                                                                  char** envp) {
  st::apply_runtime_defaults(argc, argv, envp);
}

namespace st {

bool omp_wait_policy_is_stabletrains() {
  const char* marker = std::getenv(kMarker);
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return marker && policy && std::strcmp(marker, kOurs) == 0 && std::strcmp(policy, "passive") == 0;
}

std::string omp_wait_policy_description() {
  if (is_set("OMP_WAIT_POLICY"))
    return std::string(std::getenv("OMP_WAIT_POLICY")) +
           (omp_wait_policy_is_stabletrains() ? " (stabletrain's default)" : " (from OMP_WAIT_POLICY)");
  if (is_set("GOMP_SPINCOUNT"))
    return std::string("spin count ") + std::getenv("GOMP_SPINCOUNT") + " (from GOMP_SPINCOUNT)";
  return "OpenMP's default (spin, then sleep)";
}

std::string blas_description() {
  const std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  const size_t sp = config.find(' ', config.find(' ') + 1);
  const std::string version = config.substr(0, sp == std::string::npos ? config.size() : sp);
  const std::string who = is_set("OPENBLAS_CORETYPE")
                              ? std::string("from OPENBLAS_CORETYPE=") + std::getenv("OPENBLAS_CORETYPE")
                              : "OpenBLAS's choice for this CPU";
  return version + ", " + blas_kernel_set() + " kernels (" + who + ")";
}

std::string blas_kernel_set() { return openblas_get_corename(); }

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
