// Issue 5, item 4: the Qiu & Yao tied-maximum bias, run through the shared bias experiment
// (attention/experiments.h) at a small size. Judged by standard errors over rows, never by
// a ratio of two means one of which is noise (RESEARCH.md section 4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "attention/experiments.h"

using namespace st;

namespace {

// 1024 rows per kind: the flash bias (about -1e-3, SE about 1e-5 here) sits ~70 SE from 0,
// far beyond the 10 SE asserted; the run takes a few seconds on 2 cores.
BiasReport small_run(double v_mean, double v_std) {
  BiasConfig c;
  c.rows = 1024;
  c.kinds = {BiasRows::TiedTile, BiasRows::Single};
  c.accums = {BiasAccum::Bf16};
  c.baseline = false;
  c.deltas = false;
  c.v_mean = v_mean;
  c.v_std = v_std;
  c.seed = 5;
  return run_bias_experiment(c);
}

const BiasSeries& get(const BiasReport& r, BiasRows k, const std::string& backend) {
  const BiasSeries* s = r.find(k, BiasAccum::Bf16, backend, "o");
  EXPECT_NE(s, nullptr) << backend;
  static const BiasSeries none{};
  return s ? *s : none;
}

std::string describe(const BiasSeries& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %s: mean %+.3e +- %.1e (z %.1f)", s.backend.c_str(),
                bias_rows_name(s.kind), s.mean, s.se, s.se > 0 ? s.mean / s.se : 0.0);
  return buf;
}

// Common checks; `strict_fix`: stabilized flash within 2 SE of 0 (RESEARCH.md section 4's
// setting), otherwise only "removes at least 90% of flash's bias" (see the V > 0 test).
void check_bias(double v_mean, double v_std, bool strict_fix) {
  const BiasReport r = small_run(v_mean, v_std);
  ASSERT_EQ(r.same_tile_fraction.size(), 2u);
  EXPECT_EQ(r.same_tile_fraction[0], 1.0);  // every tied row has its ties in one tile
  EXPECT_EQ(r.same_tile_fraction[1], 0.0);
  for (const auto& s : r.series) {
    EXPECT_EQ(s.nonfinite, 0.0) << describe(s);
    EXPECT_GE(s.rows, 1024);
    EXPECT_GT(s.mean_abs, 0.0) << describe(s);  // an all-zero error would prove nothing
    EXPECT_GT(s.se, 0.0) << describe(s);
  }
  // Tied maxima in one tile, BF16 O~: biased, more than 10 SE from 0, along sign(mean V).
  const BiasSeries& fl = get(r, BiasRows::TiedTile, "flash");
  EXPECT_GT(std::fabs(fl.mean), 10 * fl.se) << describe(fl);
  EXPECT_EQ(std::signbit(fl.mean), std::signbit(v_mean)) << describe(fl);
  // Stabilized flash (beta 2 and 7).
  for (const char* b : {"stabilized_b2", "stabilized_b7"}) {
    const BiasSeries& st = get(r, BiasRows::TiedTile, b);
    EXPECT_LT(std::fabs(st.mean), 0.1 * std::fabs(fl.mean)) << describe(st);
    if (strict_fix) {
      EXPECT_LT(std::fabs(st.mean), 2 * st.se) << describe(st);
    }
  }
  // A single maximum: no tied-maximum bias. Not "within 3 SE of 0": with V ~ N(-1, 0.5) flash
  // has a real -5.8e-6 (10 SE at 4000 rows; RESEARCH.md's -4.5e-6 +- 5e-7 is 9 SE), because
  // rows whose v_max is near 0 keep the small keys' contribution. Rounding the exact O once
  // to BF16 has the same kind of bias, larger; flash must not exceed it.
  const BiasSeries& one = get(r, BiasRows::Single, "flash");
  const BiasSeries& ref = get(r, BiasRows::Single, "fp64_rounded");
  for (const BiasSeries* s : {&fl, &get(r, BiasRows::TiedTile, "stabilized_b2"),
                              &get(r, BiasRows::TiedTile, "stabilized_b7"), &one, &ref})
    std::printf("  V ~ N(%g, %g): %s\n", v_mean, v_std, describe(*s).c_str());
  EXPECT_LT(std::fabs(one.mean), std::fabs(ref.mean) + 3 * one.se)
      << describe(one) << " vs " << describe(ref);
  EXPECT_LT(std::fabs(one.mean), 0.02 * std::fabs(fl.mean)) << describe(one);
}

}  // namespace

// RESEARCH.md section 4's setting: V ~ N(-1, 0.5).
TEST(AttnBias, TiedMaximaBiasFollowsNegativeV) { check_bias(-1.0, 0.5, true); }

// V ~ N(0.7, 0.3): the bias turns positive. Here stabilized flash with beta = 2 keeps a small
// residual along sign(V) (+1.9e-5 +- 4.7e-6 at 4000 rows, 2.6% of flash's +7.4e-4), so only
// the 90% reduction is asserted (bench/results/attn_bias.md).
TEST(AttnBias, TiedMaximaBiasFollowsPositiveV) { check_bias(0.7, 0.3, false); }
