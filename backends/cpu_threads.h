// CPU threading: the OpenMP wait policy, the thread count, and run.threads: auto.
//
// Wait policy. An OpenMP thread that finds no work spins before it sleeps (libgomp: ~300k
// spins by default; OMP_WAIT_POLICY=active spins indefinitely). On a machine whose cores are
// shared with other processes, a spinning thread takes the core that the thread it waits for
// needs, and a 2-thread run collapses (measured: bench/results/2026-11-27_cpu_threads_2core.md).
// stabletrain's executables therefore run with OMP_WAIT_POLICY=passive unless the
// environment sets OMP_WAIT_POLICY or GOMP_SPINCOUNT, or STABLETRAIN_RUNTIME_ENV (any value:
// take OpenMP's default). libgomp reads the variable once, when it is loaded, so an
// executable started without it sets it and re-executes itself (cpu_threads.cpp); the
// marker STABLETRAIN_RUNTIME_ENV=OMP_WAIT_POLICY=passive then says the policy is ours.
//
// BLAS kernels. OpenBLAS picks its kernel set when it loads (OPENBLAS_CORETYPE overrides the
// choice; this development machine sets it, see docs/ARCHITECTURE.md). The kernel set decides
// the GEMMs' bits, so train.log and bench name it (blas_description()).
//
// Thread count. Every CPU kernel gives the same bits for any thread count (fixed partitions,
// layers/matmul_cpu.cpp), so the count may change during a run. ThreadTuner implements
// run.threads: auto: it times training steps at each candidate count, keeps the fastest,
// and re-measures when the step time drifts or every `reprobe_every` steps.
#pragma once
#include <string>
#include <vector>

namespace st {

// What libgomp was started with: "passive (stabletrain's default)", "<value> (from
// OMP_WAIT_POLICY)", "spin count N (from GOMP_SPINCOUNT)" or "OpenMP's default (spin, then
// sleep)".
std::string omp_wait_policy_description();
// True when OMP_WAIT_POLICY is stabletrain's default rather than the user's: a program this
// process starts that is not stabletrain's (PyTorch in `bench step`) should then run without it.
bool omp_wait_policy_is_stabletrains();

// The BLAS, the kernel set it runs and who chose it: "OpenBLAS 0.3.21, Haswell kernels (from
// OPENBLAS_CORETYPE=Haswell)" or "..., Cooperlake kernels (OpenBLAS's choice for this CPU)".
std::string blas_description();
// OpenBLAS's name of the kernel set it runs ("SkylakeX", "Haswell", ...).
std::string blas_kernel_set();

// Cores this process may run on (sched_getaffinity; at least 1).
int cpu_cores_available();

// Sets the OpenMP thread count (OpenBLAS stays single-threaded: the GEMMs are tiled by
// OpenMP, layers/matmul_cpu.cpp). threads <= 0 leaves OpenMP's default.
void set_cpu_threads(int threads);
int cpu_threads();  // omp_get_max_threads()

class ThreadTuner {
 public:
  // candidates: thread counts to choose from (e.g. 1..cores), tried in order.
  explicit ThreadTuner(std::vector<int> candidates, int reprobe_every = 100);
  // The count to use for the next step.
  int current() const { return current_; }
  // Report the wall time of a training step run at current(). Returns true when the choice
  // changed (`why` then says from what to what and the measured times).
  bool record(double seconds, std::string* why);
  const std::vector<int>& candidates() const { return cand_; }
  // True while a probe pass tries candidates (the next step may run at a count that will
  // not be kept).
  bool probing() const { return probing_ >= 0; }

 private:
  void start_probe(int first);  // a probe pass that measures cand_[first] first

  std::vector<int> cand_;
  std::vector<double> time_;    // the latest measurement per candidate
  std::vector<int> order_;      // the candidates in the order of the current probe pass
  std::vector<double> window_;  // the latest settled step times
  int reprobe_every_;
  int current_ = 1;
  int probing_ = -1;        // index into order_ during a probe pass, -1 when settled
  int best_ = 0;            // index into cand_ of the chosen count
  int since_probe_ = 0;     // steps since the last probe pass ended
  int steps_in_probe_ = 0;  // steps of the candidate being probed
  double probe_acc_ = 0;
  double pass_best_ = 0;    // the fastest candidate so far in this pass (0: none yet)
  double settled_ref_ = 0;  // the chosen count's time when the probe pass ended
  bool decided_ = false;
};

// The counts run.threads: auto chooses from: all `cores` first, then fewer (every count up to
// 4, halving above).
std::vector<int> thread_candidates(int cores);

}  // namespace st
