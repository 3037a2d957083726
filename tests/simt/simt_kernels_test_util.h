// The parts of the SIMT emulator's kernel tests (test_simt_kernels.cpp and
// test_simt_kernels_softmax.cpp, one executable) that both files use: the formats, random
// inputs, ulps, the element-by-element comparison with its tolerance, and the
// format-parameterised fixture (instantiated once, in test_simt_kernels.cpp). Label emu.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "simt/simt_test_util.h"

namespace st::simt_kernels {

using simt_test::Buf;
using simt_test::dev;
using simt_test::host;
using simt_test::same_bytes;
using simt_test::two_schedules;

inline constexpr DType kFmts[] = {DType::F32, DType::BF16, DType::F16};

// Random values scale * N(0,1) + shift, rounded to fmt, never zero.
inline std::vector<float> randv(size_t n, DType fmt, uint64_t seed, double scale = 1.0,
                         double shift = 0.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    do {
      x = round_to(fmt, static_cast<float>(scale * r.normal() + shift));
    } while (x == 0.0f);
  }
  return v;
}

inline double ulp(DType fmt, double x) {
  const int mant = fmt == DType::BF16 ? 8 : fmt == DType::F16 ? 11 : 24;
  const double min_normal = fmt == DType::BF16 ? 0x1p-126 : fmt == DType::F16 ? 0x1p-14 : 0x1p-126;
  const double ax = std::max(std::fabs(x), min_normal);
  int e;
  std::frexp(ax, &e);
  return std::ldexp(1.0, e - mant);
}

struct Tol {
  bool exact;
  double ulps, floor;
};
inline constexpr Tol kExact{true, 0, 0};

// Compares got (device) with want (CPU) element by element; returns the max error in ulps.
inline double compare(const char* what, const Buf& got, const std::vector<float>& want, DType fmt,
               Tol tol) {
  EXPECT_EQ(got.n(), want.size()) << what;
  double maxref = 0, worst = 0;
  for (float w : want) maxref = std::max(maxref, static_cast<double>(std::fabs(w)));
  int shown = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float g = got.get(i), w = want[i];
    const double d = std::fabs(static_cast<double>(g) - w);
    const double u = ulp(fmt, w);
    const bool ok = tol.exact ? (std::memcmp(&g, &w, 4) == 0 || (std::isnan(g) && std::isnan(w)))
                              : (d <= tol.ulps * u + tol.floor * maxref);
    if (!ok && shown++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: emulated " << g << ", CPU " << w << ", off by "
                    << d / u << " ulp (allowed " << (tol.exact ? 0.0 : tol.ulps) << " + "
                    << tol.floor << " * " << maxref << ")";
    }
    if (std::isfinite(d)) worst = std::max(worst, d / u);
  }
  std::printf("  %-40s %s  max %.2f ulp\n", what, dtype_name(fmt), worst);
  return worst;
}
inline std::vector<float> values(const Tensor& t) {
  const float* p = static_cast<const float*>(t.raw());
  return std::vector<float>(p, p + t.numel());
}

class SimtKernels : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend(1);
};

}  // namespace st::simt_kernels
