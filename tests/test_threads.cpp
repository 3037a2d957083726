// CPU threading (backends/cpu_threads.h): results that do not depend on the thread count,
// the run.threads: auto tuner on scripted step times, and the OpenMP wait policy the
// executables start with.
#include <cblas.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <strings.h>

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

TEST(CpuThreads, MatmulBackwardIsItsTilesBlasCalls) {
  // The definition the bits rest on (docs/ARCHITECTURE.md): every GEMM output is cut into
  // fixed 256 x 256 tiles, each one single-threaded BLAS call over the whole K. The backward
  // runs dinp's and dW's tiles as one pool; written out here tile by tile, one after another,
  // the results must be the same bits at any thread count. FP32 (dW accumulated in place)
  // and BF16 (dW = round(dW + round(product))). Shapes with partial tiles.
  const int N = 300, C = 520, OC = 600, kT = 256;
  const auto inp = randn(size_t(N) * C, 21), w = randn(size_t(OC) * C, 22),
             dout = randn(size_t(N) * OC, 23), dw0 = randn(size_t(OC) * C, 24);
  auto tiled = [&](CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int Nn, int K, const float* A,
                   int lda, const float* B, int ldb, float beta, float* Cm, int ldc) {
    for (int i0 = 0; i0 < M; i0 += kT)
      for (int j0 = 0; j0 < Nn; j0 += kT)
        cblas_sgemm(CblasRowMajor, ta, tb, std::min(kT, M - i0), std::min(kT, Nn - j0), K, 1.f,
                    ta == CblasNoTrans ? A + size_t(i0) * lda : A + i0, lda,
                    tb == CblasNoTrans ? B + j0 : B + size_t(j0) * ldb, ldb, beta,
                    Cm + size_t(i0) * ldc + j0, ldc);
  };
  const int before = cpu_threads();
  for (DType fmt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(fmt));
    // One thread: a BLAS call outside an OpenMP parallel region takes OpenMP's thread count
    // (OpenBLAS's OpenMP build), and its bits change with it.
    set_cpu_threads(1);
    std::vector<float> want_dinp(size_t(N) * C), want_dw = dw0, product(size_t(OC) * C);
    tiled(CblasNoTrans, CblasNoTrans, N, C, OC, dout.data(), OC, w.data(), C, 0.f,
          want_dinp.data(), C);
    for (float& x : want_dinp) x = round_to(fmt, x);
    if (fmt == DType::F32) {
      tiled(CblasTrans, CblasNoTrans, OC, C, N, dout.data(), OC, inp.data(), C, 1.f,
            want_dw.data(), C);
    } else {
      tiled(CblasTrans, CblasNoTrans, OC, C, N, dout.data(), OC, inp.data(), C, 0.f,
            product.data(), C);
      for (size_t i = 0; i < want_dw.size(); ++i)
        want_dw[i] = round_to(fmt, want_dw[i] + round_to(fmt, product[i]));
    }
    for (int threads : {1, 2, 3}) {
      set_cpu_threads(threads);
      std::vector<float> dinp(size_t(N) * C), dw = dw0;
      cpu::matmul_backward(dinp.data(), dw.data(), static_cast<float*>(nullptr), dout.data(),
                           inp.data(), w.data(), N, C, OC, fmt);
      EXPECT_EQ(dinp, want_dinp) << threads << " threads";
      EXPECT_EQ(dw, want_dw) << threads << " threads";
    }
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

namespace {
// Every "GOMP_SPINCOUNT = 'N'" that libgomp printed, in order (OMP_DISPLAY_ENV / omp_display_env).
std::vector<std::string> spin_counts(const std::string& text) {
  std::vector<std::string> out;
  const std::string key = "GOMP_SPINCOUNT = '";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    const size_t b = at + key.size();
    out.push_back(text.substr(b, text.find('\'', b) - b));
  }
  return out;
}

// Runs a shell command, returns stdout and stderr together.
std::string run(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen((cmd + " 2>&1").c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return out;
}
}  // namespace

TEST(CpuThreads, LibgompRunsTheWaitPolicyTheLogNames) {
  // What libgomp itself read when it was loaded (its spin count: 0 = passive, 300000 =
  // libgomp's default), against what omp_wait_policy_description() says, which train.log
  // and bench print. A policy set too late to reach libgomp fails here.
  testing::internal::CaptureStderr();
  omp_display_env(1);
  const std::vector<std::string> spin = spin_counts(testing::internal::GetCapturedStderr());
  ASSERT_EQ(spin.size(), 1u);
  const std::string d = omp_wait_policy_description();
  const char* user = std::getenv("OMP_WAIT_POLICY");
  if (!user && !std::getenv("GOMP_SPINCOUNT") && !std::getenv("STABLETRAIN_RUNTIME_ENV"))
    FAIL() << "the executable did not set its wait policy (no STABLETRAIN_RUNTIME_ENV)";
  if (d == "passive (stabletrain's default)" || d == "passive (from OMP_WAIT_POLICY)")
    EXPECT_EQ(spin[0], "0") << d;
  else if (d == "OpenMP's default (spin, then sleep)")
    EXPECT_EQ(spin[0], "300000") << d;
  else
    EXPECT_NE(d.find("from"), std::string::npos) << d;  // a user's own setting, named
}

TEST(CpuThreads, AFreshProcessReExecutesOnceWithPassiveWaiting) {
  // A process started without the policy or the marker: libgomp is loaded twice (printing
  // its settings each time), first with its default, then, after the re-exec, passive; the
  // program runs once with its arguments (--help prints its usage once).
  const std::string clean =
      "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u STABLETRAIN_RUNTIME_ENV OMP_DISPLAY_ENV=verbose ";
  const std::string out = run(clean + ST_TRAIN_BIN " --help");
  EXPECT_EQ(spin_counts(out), (std::vector<std::string>{"300000", "0"})) << out;
  size_t usages = 0;
  for (size_t at = out.find("Usage:"); at != std::string::npos; at = out.find("Usage:", at + 1))
    ++usages;
  EXPECT_EQ(usages, 1u) << out;
  // The opt-out, and a user's policy: no re-exec, the setting as given.
  EXPECT_EQ(spin_counts(run(clean + "STABLETRAIN_RUNTIME_ENV=none " ST_TRAIN_BIN " --help")),
            (std::vector<std::string>{"300000"}));
  EXPECT_EQ(spin_counts(run(clean + "GOMP_SPINCOUNT=1000 " ST_TRAIN_BIN " --help")),
            (std::vector<std::string>{"1000"}));
}

TEST(CpuThreads, FreedLargeBlocksLeaveTheHeap) {
  // The executables fix glibc's mmap threshold at 1 MiB (cpu_threads.cpp): a large block is
  // mapped, and unmapped when freed, even after larger blocks were freed before it (glibc's
  // dynamic threshold would have risen to their size and kept this one in the heap).
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc (no mmap threshold to test)";
#endif
  if (std::getenv("MALLOC_MMAP_THRESHOLD_")) GTEST_SKIP() << "MALLOC_MMAP_THRESHOLD_ is set";
  for (size_t mib : {8, 16, 24}) {
    std::vector<char> big(mib << 20, 1);
    ASSERT_EQ(big[12345], 1);
  }
  const size_t before = mallinfo2().hblkhd;  // bytes in mmapped blocks
  std::vector<char> block(size_t(4) << 20, 1);
  EXPECT_GE(mallinfo2().hblkhd, before + (size_t(4) << 20));
  ASSERT_EQ(block[4321], 1);
}

TEST(CpuThreads, BlasDescriptionNamesTheKernelsThatRun) {
  const std::string d = blas_description();
  EXPECT_EQ(d.rfind("OpenBLAS ", 0), 0u) << d;
  EXPECT_NE(d.find(blas_kernel_set() + " kernels ("), std::string::npos) << d;
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  if (core && *core) {
    EXPECT_NE(d.find(std::string("from OPENBLAS_CORETYPE=") + core), std::string::npos) << d;
    // OpenBLAS itself reports the kernel set the environment names (it honoured it).
    EXPECT_EQ(strcasecmp(blas_kernel_set().c_str(), core), 0) << blas_kernel_set() << " vs " << core;
  } else
    EXPECT_NE(d.find("OpenBLAS's choice"), std::string::npos) << d;
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
