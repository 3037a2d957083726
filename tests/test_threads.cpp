// CPU threading (backends/cpu_threads.h): results that do not depend on the thread count,
// the run.threads: auto tuner on scripted step times, and the OpenMP wait policy the
// executables start with.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "backends/cpu_threads.h"
#include "layers/cpu_kernels.h"

using namespace st;

namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

struct MatmulOut {
  std::vector<float> out, dinp, dw, db;
};

// One forward and backward of a linear layer whose GEMMs span several 256 x 256 tiles in
// every dimension (N = 300 rows, C = 70 in, OC = 600 out), at `threads` OpenMP threads.
MatmulOut matmul_at(int threads) {
  const int N = 300, C = 70, OC = 600;
  const auto inp = randn(size_t(N) * C, 1), w = randn(size_t(OC) * C, 2), b = randn(OC, 3),
             dout = randn(size_t(N) * OC, 4);
  MatmulOut r;
  r.out.resize(size_t(N) * OC);
  r.dinp.resize(size_t(N) * C);
  r.dw = randn(size_t(OC) * C, 5);  // accumulated into, as with gradient accumulation
  r.db = randn(OC, 6);
  set_cpu_threads(threads);
  cpu::matmul_forward(r.out.data(), inp.data(), w.data(), b.data(), N, C, OC, DType::F32);
  cpu::matmul_backward(r.dinp.data(), r.dw.data(), r.db.data(), dout.data(), inp.data(),
                       w.data(), N, C, OC, DType::F32);
  return r;
}

}  // namespace

TEST(CpuThreads, MatmulBitsDoNotDependOnTheThreadCount) {
  const int before = cpu_threads();
  const MatmulOut one = matmul_at(1);
  for (int t : {2, 3, 4}) {
    SCOPED_TRACE(t);
    const MatmulOut m = matmul_at(t);
    EXPECT_EQ(m.out, one.out);
    EXPECT_EQ(m.dinp, one.dinp);
    EXPECT_EQ(m.dw, one.dw);
    EXPECT_EQ(m.db, one.db);
  }
  set_cpu_threads(before);
}

TEST(CpuThreads, SumSquaresIsTheChunkedSequentialSum) {
  // layers/reduce_cpu.cpp runs groups of 8 chunks' chains side by side: every chunk must
  // still be its own sequential FP64 sum in element order, the chunk sums added in order
  // (the definition model/gpt2.h's sharded gradient norm relies on), at any thread count.
  // Sizes: 19 whole chunks and a partial one (2 groups of 8, 3 chunks after them), a
  // multiple of a group exactly, and less than one chunk.
  constexpr size_t kChunk = size_t(1) << 16;
  const int before = cpu_threads();
  for (const size_t n : {19 * kChunk + 1234, 16 * kChunk, size_t(5000)}) {
    auto x = randn(n, 11);
    for (size_t i = 0; i < n; i += 97) x[i] *= 1e4f;  // a wide range, so order matters
    double want = 0;
    for (size_t c0 = 0; c0 < n; c0 += kChunk) {
      double s = 0;
      for (size_t i = c0; i < std::min(n, c0 + kChunk); ++i)
        s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      want += s;
    }
    // The same sum in another order differs in the last bits, so equality below means the
    // order is the chunked one, not a lucky rounding.
    double other = 0;
    for (size_t i = n; i-- > 0;) other += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    if (n > kChunk) {
      EXPECT_NE(other, want) << "n = " << n << ": inputs too tame to tell orders apart";
    }
    for (int threads : {1, 2, 3}) {
      set_cpu_threads(threads);
      EXPECT_EQ(cpu::sum_squares(x.data(), n), want) << "n = " << n << ", " << threads << " threads";
    }
  }
  set_cpu_threads(before);
}

TEST(CpuThreads, ExecutablesStartWithPassiveWaiting) {
  // This test binary links the CPU backend, so the .preinit_array entry ran before libgomp
  // read its environment (unless the environment set a policy itself).
  const char* user = std::getenv("OMP_WAIT_POLICY");
  const std::string d = omp_wait_policy_description();
  if (user && *user) {
    EXPECT_NE(d.find("from OMP_WAIT_POLICY"), std::string::npos) << d;
  } else if (!std::getenv("GOMP_SPINCOUNT")) {
    EXPECT_EQ(d, "passive (stabletrain's default)");
  }
}

TEST(CpuThreads, CandidatesStartWithEveryCore) {
  EXPECT_EQ(thread_candidates(1), (std::vector<int>{1}));
  EXPECT_EQ(thread_candidates(2), (std::vector<int>{2, 1}));
  EXPECT_EQ(thread_candidates(4), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(thread_candidates(16), (std::vector<int>{16, 8, 4, 3, 2, 1}));
  EXPECT_GE(cpu_cores_available(), 1);
}

namespace {
// Drives a tuner with step times given per thread count; returns the log lines it produced.
std::vector<std::string> drive(ThreadTuner& t, const std::map<int, double>& secs, int steps,
                               std::map<int, int>* steps_at = nullptr) {
  std::vector<std::string> lines;
  for (int i = 0; i < steps; ++i) {
    const int n = t.current();
    if (steps_at) ++(*steps_at)[n];
    std::string why;
    if (t.record(secs.at(n), &why)) lines.push_back(why);
  }
  return lines;
}
}  // namespace

TEST(ThreadTuner, PicksTheFastestCountAndSaysWhy) {
  ThreadTuner t({2, 1});
  EXPECT_EQ(t.current(), 2);  // all cores are measured first
  const auto lines = drive(t, {{2, 1.0}, {1, 0.4}}, 20);
  EXPECT_EQ(t.current(), 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "1 threads (s/step: 1 s at 2, 0.4 s at 1)");
}

TEST(ThreadTuner, ProbingLastsUntilTheChoiceIsMade) {
  // The trainer leaves probe steps out of its timing line (train/progress.h): probing() must
  // be true exactly while candidates are being tried, and true again on a re-probe.
  ThreadTuner t({2, 1}, 10);
  int probe_steps = 0, first_settled = -1;
  for (int s = 0; s < 40; ++s) {
    if (t.probing())
      ++probe_steps;
    else if (first_settled < 0)
      first_settled = s;
    std::string why;
    t.record(t.current() == 2 ? 0.3 : 0.5, &why);
  }
  EXPECT_GE(first_settled, 2) << "the first pass tries both counts";
  EXPECT_LE(first_settled, 8);
  EXPECT_GT(probe_steps, first_settled) << "no re-probe in 40 steps at a period of 10";
  EXPECT_FALSE(ThreadTuner({1}).probing()) << "one candidate: nothing to probe";
}

TEST(ThreadTuner, KeepsAllCoresWhenTheyAreFastest) {
  ThreadTuner t({4, 3, 2, 1});
  const auto lines = drive(t, {{4, 0.3}, {3, 0.35}, {2, 0.5}, {1, 0.9}}, 30);
  EXPECT_EQ(t.current(), 4);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("4 threads", 0), 0u) << lines[0];
}

TEST(ThreadTuner, ASlowCandidateCostsOneStep) {
  ThreadTuner t({2, 1});
  std::map<int, int> at;
  // 1 thread is measured first only on a re-probe; here all cores come first and are fast.
  drive(t, {{2, 0.1}, {1, 5.0}}, 6, &at);
  EXPECT_EQ(at[1], 1) << "the 50x slower count was probed for more than one step";
  EXPECT_EQ(t.current(), 2);
}

TEST(ThreadTuner, FollowsAChangeOfLoad) {
  ThreadTuner t({2, 1}, 1000);
  drive(t, {{2, 0.2}, {1, 0.35}}, 30);
  EXPECT_EQ(t.current(), 2);
  // Another process takes a core: 2 threads now wait for each other.
  const auto lines = drive(t, {{2, 1.5}, {1, 0.4}}, 30);
  EXPECT_EQ(t.current(), 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("2 -> 1 threads", 0), 0u) << lines[0];
  // The core comes back: the faster step of 1 thread is no change of load for it, but the
  // periodic re-probe is not due (1000 steps), so it stays; a shorter period finds 2 again.
  ThreadTuner u({2, 1}, 40);
  drive(u, {{2, 1.5}, {1, 0.4}}, 20);
  EXPECT_EQ(u.current(), 1);
  const auto back = drive(u, {{2, 0.2}, {1, 0.35}}, 60);
  EXPECT_EQ(u.current(), 2);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].rfind("1 -> 2 threads", 0), 0u) << back[0];
}

TEST(ThreadTuner, OneCandidateNeverProbes) {
  ThreadTuner t({1});
  EXPECT_TRUE(drive(t, {{1, 0.5}}, 50).empty());
  EXPECT_EQ(t.current(), 1);
}
