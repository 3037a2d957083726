// Helpers shared by the attention tests (the emulator's tests/simt/test_simt_flash*.cpp and
// test_simt_flash_amp.cpp, the GPU's tests/test_gpu_flash*.cpp and test_gpu_attention*.cpp,
// tests/test_attention*.cpp and tests/flash_amp_cases.h): the problem's dimensions, one ulp
// of a format, errors of vectors, the comparison of per-head statistics, and the random and
// constructed inputs, drawn so that every test that used its own copy gets the same bits.
// Host C++ only; values of the compute format in FP32 storage (the CPU convention).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/attention.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace st::attn_test {

struct Dims {
  int B, T, NH, hs;
  int C() const { return NH * hs; }
  size_t rows() const { return static_cast<size_t>(B) * NH * T; }        // (B, NH, T)
  size_t n_out() const { return static_cast<size_t>(B) * T * C(); }      // (B, T, C)
  size_t n_qkv() const { return static_cast<size_t>(B) * T * 3 * C(); }  // (B, T, 3C)
};

// One ulp of format fmt at |x| (normal range); 0 for x <= 0. The format is always explicit:
// BF16 (7 fraction bits), F16 (10), anything else F32 (23).
inline double ulp_at(double x, DType fmt) {
  const int mant = fmt == DType::BF16 ? 7 : fmt == DType::F16 ? 10 : 23;
  return x > 0 ? std::ldexp(1.0, static_cast<int>(std::floor(std::log2(x))) - mant) : 0.0;
}

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// max |a - ref|; NaN anywhere (or a size mismatch) counts as infinite error.
inline double max_err(const std::vector<double>& a, const std::vector<double>& ref) {
  if (a.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - ref[i]);
    if (std::isnan(e)) return std::numeric_limits<double>::infinity();
    m = std::max(m, e);
  }
  return m;
}

// One head's statistics from the kernels (a) and the CPU lab (b) on one line:
// "<prefix> head <h>: rows a/b tied ... (<who>)".
inline void print_head_stats(const std::string& prefix, size_t h, const AttentionHeadStats& a,
                             const AttentionHeadStats& b, const char* who) {
  std::printf(
      "%s head %zu: rows %lld/%lld tied %lld/%lld in_tile %lld/%lld "
      "p_one %lld/%lld p_tilde_one %lld/%lld max_logit %.9g/%.9g entropy %.12g/%.12g "
      "(%s)\n",
      prefix.c_str(), h, (long long)a.rows, (long long)b.rows, (long long)a.tied_rows,
      (long long)b.tied_rows, (long long)a.tied_in_tile, (long long)b.tied_in_tile,
      (long long)a.p_one, (long long)b.p_one, (long long)a.p_tilde_one,
      (long long)b.p_tilde_one, a.max_logit, b.max_logit, a.mean_entropy(), b.mean_entropy(),
      who);
}

// The counts equal; max_logit equal on exact scores (else within 1e-6 relative: no score
// sits within FP32 rounding of a tie threshold or of P~ = 1 on the random inputs); the
// entropy to 1e-9 relative (FP64, another order).
inline void expect_same_head_stats(const AttentionHeadStats& a, const AttentionHeadStats& b,
                                   bool exact) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.tied_rows, b.tied_rows);
  EXPECT_EQ(a.tied_in_tile, b.tied_in_tile);
  EXPECT_EQ(a.p_one, b.p_one);
  EXPECT_EQ(a.p_tilde_one, b.p_tilde_one);
  if (exact) {
    EXPECT_EQ(a.max_logit, b.max_logit);
  } else {
    EXPECT_NEAR(a.max_logit, b.max_logit, 1e-6 * (1 + std::fabs(b.max_logit)));
  }
  EXPECT_NEAR(a.entropy_sum, b.entropy_sum, 1e-9 * (1 + std::fabs(b.entropy_sum)));
}

// Host inputs: qkv (B, T, 3C) and the output gradient dout (B, T, C).
struct Inputs {
  Dims d;
  std::vector<float> qkv, dout;
};

// Fills qkv (B, T, 3C) in storage order, one normal per element: q ~ q_scale N(0,1),
// k ~ N(0,1), v ~ v_mean + v_std N(0,1), rounded to fmt (q scaled: peakier rows).
inline void draw_qkv(std::vector<float>& qkv, const Dims& d, DType fmt, Rng& rng, double q_scale,
                     double v_mean = 0.0, double v_std = 1.0) {
  const int C = d.C();
  for (size_t i = 0; i < qkv.size(); ++i) {
    const int part = static_cast<int>(i % (3 * C)) / C;
    const double n = rng.normal();
    const double v = part == 0 ? q_scale * n : part == 1 ? n : v_mean + v_std * n;
    qkv[i] = round_to(fmt, static_cast<float>(v));
  }
}

// The keys made identical in the tied-maxima inputs: both inside the first key tile of
// every tile size, and visible to causal rows t >= kTieB.
constexpr int kTieA = 2, kTieB = 5;

// In every (b, h), keys kTieA and kTieB become one vector w ~ 3 N(0,1) (hs normals per head,
// rounded to fmt): their scores are identical in every format and order, and large (std 3
// q_scale against q_scale for the other keys), so in many rows they are the row's maximum,
// tied.
inline void tie_keys(std::vector<float>& qkv, const Dims& d, DType fmt, Rng& rng) {
  const int C = d.C();
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h) {
      std::vector<float> w(d.hs);
      for (float& x : w) x = round_to(fmt, static_cast<float>(3.0 * rng.normal()));
      for (int s : {kTieA, kTieB}) {
        if (s >= d.T) continue;
        for (int j = 0; j < d.hs; ++j)
          qkv[(static_cast<size_t>(b) * d.T + s) * 3 * C + C + h * d.hs + j] = w[j];
      }
    }
}

// q ~ q_scale N(0,1), k, v, dout ~ N(0,1), rounded to fmt; tie: keys kTieA and kTieB tied
// (tie_keys, drawn after dout).
inline Inputs random_inputs(const Dims& d, DType fmt, uint64_t seed, double q_scale, bool tie) {
  Inputs in{d, std::vector<float>(d.n_qkv()), std::vector<float>(d.n_out())};
  Rng rng(seed);
  draw_qkv(in.qkv, d, fmt, rng, q_scale);
  for (float& g : in.dout) g = round_to(fmt, static_cast<float>(rng.normal()));
  if (tie) tie_keys(in.qkv, d, fmt, rng);
  return in;
}

// Scores chosen exactly in format fmt: S[b][h][t][s] = x_s of the (b, h) sequence x, for
// every query row t (q = e0 + e1, k[0] + k[1] = 8 x_s as a hi/lo pair of fmt values, scale
// 1/8 at hs 64); values from a small set so that ties (exact and within tie_tol), ties
// across tiles and P~ == 1 all occur. V ~ N(0,1); dout zero.
inline Inputs stats_inputs(DType fmt, int B, int NH, int T, uint64_t seed) {
  const Dims d{B, T, NH, 64};
  const int C = d.C();
  Inputs in{d, std::vector<float>(d.n_qkv(), 0.0f), std::vector<float>(d.n_out(), 0.0f)};
  Rng rng(seed);
  const double set[] = {0.0, 0.5, 1.0, 2.0, 3.0, 3.0 + 0x1p-11, -1.0, 4.0};
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int s = 0; s < T; ++s) {
        const size_t row = (static_cast<size_t>(b) * T + s) * 3 * C + h * 64;
        in.qkv[row] = in.qkv[row + 1] = 1.0f;  // q = e0 + e1
        // A rare maximum 5 (or 5 - 2^-11, tied within tie_tol): ties inside and across tiles.
        const double u = rng.uniform();
        const double x = u < 0.02 ? 5.0 : u < 0.03 ? 5.0 - 0x1p-11 : set[rng.below(8)];
        const double X = 8 * x;
        const double hi = round_fmt(X, fmt);
        in.qkv[row + C] = static_cast<float>(hi);
        in.qkv[row + C + 1] = static_cast<float>(round_fmt(X - hi, fmt));
        for (int j = 0; j < 64; ++j)
          in.qkv[row + 2 * C + j] = round_to(fmt, static_cast<float>(rng.normal()));
      }
  return in;
}

}  // namespace st::attn_test
