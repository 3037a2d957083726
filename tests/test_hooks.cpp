// Stability hooks (train/hooks.h): power iteration against independent SVDs, the spike
// detector, and Qiu & Yao's delta-drift diagnostic on a constructed tied-maximum case.
// The end-to-end hook files of real runs are tested in test_hooks_run.cpp.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "train/hooks.h"
#include "model_shapes.h"

extern "C" void dgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n,
                        double* a, const int* lda, double* s, double* u, const int* ldu,
                        double* vt, const int* ldvt, double* work, const int* lwork, int* info);

namespace st {
namespace {

// Largest singular value by LAPACK (column-major copy of a row-major matrix).
double lapack_sigma_max(const std::vector<double>& a, int m, int n) {
  std::vector<double> cm(a.size());
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) cm[static_cast<size_t>(c) * m + r] = a[static_cast<size_t>(r) * n + c];
  std::vector<double> s(std::min(m, n));
  double wq = 0, dummy = 0;
  int lwork = -1, info = 0, one = 1;
  dgesvd_("N", "N", &m, &n, cm.data(), &m, s.data(), &dummy, &one, &dummy, &one, &wq, &lwork,
          &info);
  lwork = static_cast<int>(wq);
  std::vector<double> work(lwork);
  dgesvd_("N", "N", &m, &n, cm.data(), &m, s.data(), &dummy, &one, &dummy, &one, work.data(),
          &lwork, &info);
  EXPECT_EQ(info, 0);
  return s[0];
}

GPT2Config small_config() { return st::test::gpt2_shape(2, 4, 64, 32, 300); }

TEST(SpectralNorm, EveryMatrixSliceOfRandomWeightsMatchesLapack) {
  const GPT2Config c = small_config();
  std::mt19937_64 g(7);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> flat(static_cast<size_t>(num_parameters(c)));
  for (auto& x : flat) x = nd(g);
  int checked = 0, heads = 0;
  for (const WeightSlice& s : weight_slices(c, true)) {
    if (s.rows < 2 || s.cols < 2) continue;
    std::vector<double> v;  // cold start, the settings every run uses by default
    const PowerResult r = spectral_norm(s, flat.data(), v, HooksSection{}.power_tol,
                                        HooksSection{}.power_iters);
    const double ref = lapack_sigma_max(s.gather(flat.data()), static_cast<int>(s.rows),
                                        static_cast<int>(s.cols));
    EXPECT_TRUE(r.converged) << slice_label(s);
    EXPECT_NEAR(r.sigma, ref, 1e-4 * ref) << slice_label(s) << " after " << r.iters;
    ++checked;
    heads += s.head >= 0;
  }
  EXPECT_EQ(heads, c.n_layer * c.n_head * 4);  // wq, wk, wv, wo
  EXPECT_GT(checked, heads);
}

// sigma_max of U diag(s) V^T with orthonormal U, V (Gram-Schmidt in FP64): known exactly
// up to the FP32 storage of the matrix.
TEST(SpectralNorm, KnownSingularValuesAndWarmStart) {
  const int m = 48, n = 96;
  std::mt19937_64 g(3);
  std::normal_distribution<double> nd;
  auto orthonormal = [&](int rows, int k) {
    std::vector<std::vector<double>> q;
    while (static_cast<int>(q.size()) < k) {
      std::vector<double> x(rows);
      for (auto& e : x) e = nd(g);
      for (const auto& p : q) {
        double d = 0;
        for (int i = 0; i < rows; ++i) d += x[i] * p[i];
        for (int i = 0; i < rows; ++i) x[i] -= d * p[i];
      }
      double nn = 0;
      for (double e : x) nn += e * e;
      for (auto& e : x) e /= std::sqrt(nn);
      q.push_back(x);
    }
    return q;
  };
  const auto U = orthonormal(m, m), V = orthonormal(n, m);
  std::vector<double> sv(m);
  for (int i = 0; i < m; ++i) sv[i] = 3.0 * std::pow(0.97, i);  // sigma_2 / sigma_1 = 0.97
  std::vector<float> a(static_cast<size_t>(m) * n);
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) {
      double x = 0;
      for (int i = 0; i < m; ++i) x += U[i][r] * sv[i] * V[i][c];
      a[static_cast<size_t>(r) * n + c] = static_cast<float>(x);
    }
  WeightSlice s;
  s.tensor = "test";
  s.rows = m, s.cols = n, s.row_stride = n;
  std::vector<double> v;
  const PowerResult cold = spectral_norm(s, a.data(), v, 1e-12, 10000);
  EXPECT_TRUE(cold.converged);
  EXPECT_NEAR(cold.sigma, 3.0, 3.0 * 1e-6);
  // Warm start from the converged vector: converged in a couple of iterations, same value.
  const PowerResult warm = spectral_norm(s, a.data(), v, 1e-12, 10000);
  EXPECT_LE(warm.iters, 3);
  EXPECT_NEAR(warm.sigma, cold.sigma, 1e-10 * cold.sigma);
  // A given (non-empty) start vector skips the Gram-matrix start: plain power iteration on
  // A from a random vector reaches the same value.
  std::vector<double> vr(n);
  for (auto& e : vr) e = nd(g);
  const PowerResult plain = spectral_norm(s, a.data(), vr, 1e-12, 10000);
  EXPECT_TRUE(plain.converged);
  EXPECT_GT(plain.iters, 20);  // sigma_2 / sigma_1 = 0.97: many iterations without the Gram start
  EXPECT_NEAR(plain.sigma, 3.0, 3.0 * 1e-6);
  // The cap is honoured and reported.
  std::vector<double> v2;
  const PowerResult capped = spectral_norm(s, a.data(), v2, 1e-15, 5);
  EXPECT_EQ(capped.iters, 5);
  EXPECT_FALSE(capped.converged);
  EXPECT_LT(capped.sigma, 3.0);
}

// A zero matrix (an uninitialised model, a head whose weights are all 0): sigma 0, and the
// vector kept for the next hook (and saved in checkpoints) a finite unit vector, through
// the Gram start (short side <= 512) and the Lanczos one (the fuzz corpus's warm hook
// state held NaN vectors, which a resume now refuses).
TEST(SpectralNorm, ZeroMatrixKeepsAFiniteUnitVector) {
  for (const int side : {16, 600}) {
    SCOPED_TRACE(side);
    const std::vector<float> a(static_cast<size_t>(side) * side, 0.0f);
    WeightSlice s;
    s.tensor = "zero";
    s.rows = s.cols = s.row_stride = side;
    std::vector<double> v;
    const PowerResult r = spectral_norm(s, a.data(), v, 1e-6, 1000);
    EXPECT_EQ(r.sigma, 0.0);
    EXPECT_TRUE(r.converged);
    ASSERT_EQ(v.size(), size_t(side));
    double ss = 0;
    for (double e : v) ss += e * e;
    EXPECT_NEAR(std::sqrt(ss), 1.0, 1e-12);
  }
}

// A cold start of a matrix whose short side exceeds the Gram start's 512 (GPT-2 small's
// 768-wide matrices) goes through restarted Lanczos: against LAPACK to the documented
// tolerance (sigma within power_tol / 2 relative), converged, in far fewer passes than
// power iteration, with the same bits whatever the number of threads.
TEST(SpectralNorm, WideMatrixLanczosStartMatchesLapack) {
  for (const auto& [m, n] : {std::pair<int, int>{560, 520}, {520, 640}}) {
    std::mt19937_64 g(11 + m);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    std::vector<float> a(static_cast<size_t>(m) * n);
    for (auto& x : a) x = nd(g);
    WeightSlice s;
    s.tensor = "wide";
    s.rows = m, s.cols = n, s.row_stride = n;
    std::vector<double> ref_a(a.begin(), a.end());
    const double ref = lapack_sigma_max(ref_a, m, n);
    const double tol = HooksSection{}.power_tol;
    std::vector<double> v;
    const PowerResult r = spectral_norm(s, a.data(), v, tol, HooksSection{}.power_iters);
    EXPECT_TRUE(r.converged) << m << "x" << n;
    EXPECT_NEAR(r.sigma, ref, 0.5 * tol * ref) << m << "x" << n << " after " << r.iters;
    // Random weights: power iteration alone from a random start has not converged after
    // twice the passes.
    EXPECT_LT(r.iters, 200) << m << "x" << n;
    std::vector<double> vp(n);
    for (auto& e : vp) e = nd(g);
    const PowerResult plain = spectral_norm(s, a.data(), vp, tol, 2 * r.iters);
    EXPECT_FALSE(plain.converged) << m << "x" << n << ": " << r.iters;
    // Thread count independence: one thread gives the same bits.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    std::vector<double> v1;
    const PowerResult one = spectral_norm(s, a.data(), v1, tol, HooksSection{}.power_iters);
    omp_set_num_threads(threads);
    EXPECT_EQ(one.sigma, r.sigma);
    EXPECT_EQ(one.iters, r.iters);
    EXPECT_EQ(v1, v);
  }
}

// Known, slowly decaying singular values of a 640 x 640 matrix (sigma_i = 2 * 0.998^i): the
// Lanczos start reaches the tolerance the power iteration checks.
TEST(SpectralNorm, WideMatrixClusteredSpectrum) {
  const int n = 640;
  std::mt19937_64 g(5);
  std::normal_distribution<double> nd;
  // A = Q1 diag(s) Q2^T with Householder-product orthogonal factors.
  auto householder = [&](std::vector<double>& M, int reps) {  // M <- H_r ... H_1 M (n x n)
    for (int r = 0; r < reps; ++r) {
      std::vector<double> h(n);
      double hn = 0;
      for (auto& e : h) {
        e = nd(g);
        hn += e * e;
      }
      for (int c = 0; c < n; ++c) {
        double d = 0;
        for (int i = 0; i < n; ++i) d += h[i] * M[static_cast<size_t>(i) * n + c];
        for (int i = 0; i < n; ++i) M[static_cast<size_t>(i) * n + c] -= 2 * d / hn * h[i];
      }
    }
  };
  std::vector<double> M(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) M[static_cast<size_t>(i) * n + i] = 2.0 * std::pow(0.998, i);
  householder(M, 3);
  // transpose, apply again: Q1 D Q2^T
  std::vector<double> Mt(M.size());
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) Mt[static_cast<size_t>(j) * n + i] = M[static_cast<size_t>(i) * n + j];
  householder(Mt, 3);
  std::vector<float> a(Mt.begin(), Mt.end());
  std::vector<double> ad(a.begin(), a.end());
  const double ref = lapack_sigma_max(ad, n, n);
  WeightSlice s;
  s.tensor = "clustered";
  s.rows = n, s.cols = n, s.row_stride = n;
  std::vector<double> v;
  const double tol = 1e-6;
  const PowerResult r = spectral_norm(s, a.data(), v, tol, 5000);
  EXPECT_TRUE(r.converged);
  EXPECT_NEAR(r.sigma, ref, 0.5 * tol * ref) << "after " << r.iters;
  EXPECT_NEAR(r.sigma, 2.0, 1e-5);
}

TEST(SpikeDetector, ZScoreOverTheWindowBefore) {
  SpikeDetector d(4, 3);
  d.push(1);
  d.push(2);
  EXPECT_FALSE(d.score(100).valid);  // fewer than `warmup` values
  d.push(3);
  const ZScore z = d.score(5);  // mean 2, population std sqrt(2/3)
  ASSERT_TRUE(z.valid);
  EXPECT_DOUBLE_EQ(z.mean, 2.0);
  EXPECT_NEAR(z.std, std::sqrt(2.0 / 3.0), 1e-15);
  EXPECT_NEAR(z.z, 3.0 / std::sqrt(2.0 / 3.0), 1e-12);
  d.push(4);
  d.push(5);  // the window keeps the last 4: {2, 3, 4, 5}
  EXPECT_DOUBLE_EQ(d.score(3.5).mean, 3.5);
  d.push(NAN);  // not added
  EXPECT_EQ(d.values().size(), 4u);
  EXPECT_FALSE(d.score(NAN).valid);
}


// Qiu & Yao's setting as a sequence of training steps: every step draws new inputs for one
// head; rows see two keys tied at the maximum (+5) inside the first key tile and all other
// keys 12..20 below; V ~ N(-1.5, 0.2) (one sign, mid-binade, so rounding the exact O once
// is unbiased); dO and the layernorm output are "nearly rank-1, similar across tokens and
// steps" (a fixed direction plus noise), as the paper describes them. Everything is BF16
// as a run stores it. The paper's failing configuration (flash, BF16 O~ accumulator) must
// show a one-signed, growing running sum and a stable dW_Q error direction; baseline
// attention and flash with an FP32 accumulator (a CUDA kernel) must not.
struct DriftSeries {
  std::vector<double> cum;  // after each step
  double sum_abs = 0;       // sum of |drift| over steps
  double mean_cos = 0;      // mean dwq_cos_prev over steps 2..
  double rel = 0;           // mean dwq_rel_err
};

DriftSeries constructed_drift(const AttentionConfig& run, int steps, uint64_t seed) {
  const int B = 2, T = 128, C = 32;  // one head of dim 32
  DeltaDriftTracker tr(1, 1, C);
  std::mt19937_64 fixed(99), g(seed);
  std::uniform_real_distribution<double> u01(0, 1);
  std::normal_distribution<double> nd;
  auto bf = [](double x) { return round_fmt(x, DType::BF16); };
  std::vector<double> u(C), w(C);
  for (auto& e : u) e = 0.5 + u01(fixed);
  for (auto& e : w) e = nd(fixed);
  DriftSeries out;
  int ncos = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<double> qkv(static_cast<size_t>(B) * T * 3 * C, 0.0), dout(static_cast<size_t>(B) * T * C),
        ln1(dout.size());
    for (int b = 0; b < B; ++b) {
      const int p1 = static_cast<int>(u01(g) * 8), p2 = (p1 + 1 + static_cast<int>(u01(g) * 7)) % 8;
      for (int t = 0; t < T; ++t) {
        double* row = qkv.data() + (static_cast<size_t>(b) * T + t) * 3 * C;
        row[0] = 1.0;                                                   // q = e_0
        const double score = (t == p1 || t == p2) ? 5.0 : 5.0 - (12 + 8 * u01(g));
        row[C] = bf(score * std::sqrt(double(C)));                      // k[0]
        for (int j = 0; j < C; ++j) row[2 * C + j] = bf(-1.5 + 0.2 * nd(g));  // v
        for (int j = 0; j < C; ++j) {
          const size_t i = (static_cast<size_t>(b) * T + t) * C + j;
          dout[i] = bf(u[j] + 0.3 * nd(g));
          ln1[i] = bf(w[j] + 0.3 * nd(g));
        }
      }
    }
    const DriftRow r = tr.layer(0, run, DType::BF16, B, T, qkv.data(), dout.data(), ln1.data(), B)[0];
    out.cum.push_back(r.cum);
    out.sum_abs += std::abs(r.drift);
    out.rel += r.dwq_rel / steps;
    if (!std::isnan(r.cos_prev)) {
      out.mean_cos += r.cos_prev;
      ++ncos;
    }
  }
  out.mean_cos /= std::max(ncos, 1);
  return out;
}

bool one_signed(const std::vector<double>& cum) {
  for (double c : cum)
    if ((c > 0) != (cum.back() > 0) || c == 0) return false;
  return true;
}

TEST(DeltaDrift, ConstructedTiedMaximaShowQiuYaoSignature) {
  AttentionConfig flash_bf16;
  flash_bf16.kind = AttentionKind::Flash;
  flash_bf16.accum = DType::BF16;
  AttentionConfig flash_fp32;
  flash_fp32.kind = AttentionKind::Flash;
  AttentionConfig stabilized = flash_bf16;
  stabilized.kind = AttentionKind::StabilizedFlash;
  AttentionConfig baseline;
  const int steps = 12;
  const struct {
    const char* name;
    AttentionConfig cfg;
  } runs[] = {{"flash, BF16 accumulator", flash_bf16},
              {"flash, FP32 accumulator", flash_fp32},
              {"stabilized flash, BF16 accumulator", stabilized},
              {"baseline", baseline}};
  std::vector<DriftSeries> res;
  for (const auto& r : runs) {
    res.push_back(constructed_drift(r.cfg, steps, 5));
    const DriftSeries& d = res.back();
    std::printf("%-36s cum %+.4e  sum|drift| %.4e  |cum|/sum %.3f  one-signed %d  mean cos %.3f  "
                "dWq rel %.2e\n", r.name, d.cum.back(), d.sum_abs,
                std::abs(d.cum.back()) / d.sum_abs, one_signed(d.cum), d.mean_cos, d.rel);
  }
  // The failing configuration: every partial sum has the sign of the bias (sign(V) * dO,
  // negative here) and the running sum is the sum of magnitudes; the error direction in
  // dW_Q repeats from step to step.
  EXPECT_TRUE(one_signed(res[0].cum));
  EXPECT_LT(res[0].cum.back(), 0);
  EXPECT_GT(std::abs(res[0].cum.back()), 0.95 * res[0].sum_abs);
  EXPECT_GT(res[0].mean_cos, 0.9);
  // FP32 accumulator and baseline: the errors partly cancel; the biased run's drift is far
  // larger than theirs.
  for (int i : {1, 3}) {
    SCOPED_TRACE(runs[i].name);
    EXPECT_LT(std::abs(res[i].cum.back()), 0.1 * std::abs(res[0].cum.back()));
  }
}

}  // namespace
}  // namespace st
