// layers/vec_math.h against libm in double, and the kernels that use it: vectorised loops
// give the bits of one-element calls, for any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu_threads.h"
#include "layers/cpu_kernels.h"
#include "layers/vec_math.h"

using namespace st;

namespace {

// |got - ref| in units of the last place of the float nearest ref.
double ulps(float got, double ref) {
  const float r = static_cast<float>(ref);
  const float up = std::nextafter(std::fabs(r), std::numeric_limits<float>::infinity());
  const double ulp = static_cast<double>(up) - std::fabs(r);
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

// Every 61st float bit pattern with |x| <= hi, both signs.
template <class F>
void for_floats(float hi, F&& f) {
  for (uint32_t u = 0; u < 0x7f800000u; u += 61) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    if (x > hi) break;
    f(x);
    f(-x);
  }
}

}  // namespace

TEST(VecMath, TanhWithinHalfAnUlp) {
  double worst = 0, worst_libm = 0;
  float at = 0;
  size_t n = 0;
  for_floats(20.0f, [&](float x) {
    const double ref = std::tanh(static_cast<double>(x));
    const double e = ulps(cpu::tanh_f32(x), ref);
    if (e > worst) worst = e, at = x;
    worst_libm = std::max(worst_libm, ulps(std::tanh(x), ref));
    ++n;
  });
  std::printf("  tanh_f32: max %.3f ulp at %.9g over %zu floats (glibc tanhf: %.3f ulp)\n", worst,
              at, n, worst_libm);
  EXPECT_LT(worst, 0.51);
  EXPECT_EQ(cpu::tanh_f32(30.0f), 1.0f);
  EXPECT_EQ(cpu::tanh_f32(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_TRUE(std::isnan(cpu::tanh_f32(std::nanf(""))));
  EXPECT_TRUE(std::signbit(cpu::tanh_f32(-0.0f)));
}

TEST(VecMath, ExpWithinHalfAnUlpOverItsFloatRange) {
  double worst = 0;
  float at = 0;
  for_floats(89.0f, [&](float x) {
    const double ref = std::exp(static_cast<double>(x));
    if (ref < std::numeric_limits<float>::min()) {  // subnormal results: absolute
      EXPECT_LE(std::fabs(cpu::exp_f32(x) - ref), 0.51 * std::pow(2.0, -149)) << x;
      return;
    }
    if (ref > std::numeric_limits<float>::max()) {
      EXPECT_EQ(cpu::exp_f32(x), std::numeric_limits<float>::infinity()) << x;
      return;
    }
    const double e = ulps(cpu::exp_f32(x), ref);
    if (e > worst) worst = e, at = x;
  });
  std::printf("  exp_f32: max %.3f ulp at %.9g\n", worst, at);
  EXPECT_LT(worst, 0.51);
  EXPECT_EQ(cpu::exp_f32(-200.0f), 0.0f);
  EXPECT_EQ(cpu::exp_f32(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(cpu::exp_f32(std::nanf(""))));
}

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float sd) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
}  // namespace

// The vectorised loop body, its scalar remainder and a one-element call agree bit for bit,
// in every format, for 1-3 threads; so do the cross-entropy rows.
TEST(VecMath, KernelsGiveTheBitsOfOneElementCallsForAnyThreadCount) {
  const size_t n = 1003;  // not a multiple of the vector width or of the thread count
  const auto x = randn(n, 1, 3.0f), g = randn(n, 2, 1.0f);
  const int before = cpu_threads();
  for (DType fmt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(fmt));
    std::vector<float> y1(n), d1(n);
    set_cpu_threads(1);  // one parallel region per element: keep them cheap
    for (size_t i = 0; i < n; ++i) {
      cpu::gelu_forward(&y1[i], &x[i], 1, fmt);
      cpu::gelu_backward(&d1[i], &x[i], &g[i], 1, fmt);
    }
    for (int t : {1, 2, 3}) {
      set_cpu_threads(t);
      std::vector<float> y(n), d(n);
      cpu::gelu_forward(y.data(), x.data(), n, fmt);
      cpu::gelu_backward(d.data(), x.data(), g.data(), n, fmt);
      EXPECT_EQ(y, y1) << t << " threads";
      EXPECT_EQ(d, d1) << t << " threads";
    }
  }
  // Cross-entropy: 7 rows of V = 1001 (padded to 1008); each row alone vs all rows at once.
  const int N = 7, V = 1001, Vp = 1008;
  const auto logits = randn(size_t(N) * Vp, 3, 4.0f);
  std::vector<int32_t> tgt(N);
  for (int i = 0; i < N; ++i) tgt[i] = (i * 379) % V;
  std::vector<float> l1(N), dl1(size_t(N) * Vp);
  set_cpu_threads(1);
  for (int i = 0; i < N; ++i)
    cpu::crossentropy_forward_backward(&l1[i], &dl1[size_t(i) * Vp], &logits[size_t(i) * Vp],
                                       &tgt[i], 1, V, Vp, 1.0f / N, DType::BF16);
  for (int t : {1, 2, 3}) {
    set_cpu_threads(t);
    std::vector<float> l(N), dl(size_t(N) * Vp), lonly(N);
    cpu::crossentropy_forward_backward(l.data(), dl.data(), logits.data(), tgt.data(), N, V, Vp,
                                       1.0f / N, DType::BF16);
    cpu::crossentropy_forward_backward(lonly.data(), static_cast<float*>(nullptr),
                                       logits.data(), tgt.data(), N, V, Vp, 1.0f / N,
                                       DType::BF16);
    EXPECT_EQ(l, l1) << t << " threads";
    EXPECT_EQ(lonly, l1) << t << " threads (no gradient)";
    EXPECT_EQ(dl, dl1) << t << " threads";
  }
  // In place (dlogits aliasing logits, as the model calls it).
  std::vector<float> inplace = logits, lin(N);
  cpu::crossentropy_forward_backward(lin.data(), inplace.data(), inplace.data(), tgt.data(), N, V,
                                     Vp, 1.0f / N, DType::BF16);
  EXPECT_EQ(lin, l1);
  EXPECT_EQ(inplace, dl1);
  set_cpu_threads(before);
}

// The cross-entropy against an FP64 evaluation: loss and gradient of a row.
TEST(VecMath, CrossEntropyMatchesFp64) {
  const int V = 5000, Vp = 5008;
  const auto logits = randn(Vp, 4, 5.0f);
  const int32_t t = 1234;
  float loss = 0;
  std::vector<float> d(Vp);
  cpu::crossentropy_forward_backward(&loss, d.data(), logits.data(), &t, 1, V, Vp, 0.5f,
                                     DType::F32);
  double mx = -1e300, sum = 0;
  for (int j = 0; j < V; ++j) mx = std::max(mx, double(logits[j]));
  for (int j = 0; j < V; ++j) sum += std::exp(double(logits[j]) - mx);
  // Tolerances: the FP32 sum of 5000 terms (relative error far below 5e-5 here) and the
  // float rounding of p - 1.
  EXPECT_NEAR(loss, std::log(sum) - (logits[t] - mx), 5e-5);
  for (int j = 0; j < V; ++j) {
    const double p = std::exp(double(logits[j]) - mx) / sum;
    EXPECT_NEAR(d[j], (p - (j == t)) * 0.5, 5e-5 * p + (j == t ? 1e-7 : 1e-12)) << j;
  }
  for (int j = V; j < Vp; ++j) EXPECT_EQ(d[j], 0.0f);
}
