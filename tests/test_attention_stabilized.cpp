// Attention numerics, part 3 of test_attention (one executable; the opening comment of
// test_attention.cpp lists the parts): stabilized flash bit-equal to flash on untied rows,
// close to FP64 with tied maxima, and the underflow cap (beta r_m large, r_m very negative,
// FP16 P~).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <vector>

#include "attention/head_cpu.h"
#include "core/attention_numerics.h"
#include "core/error.h"
#include "backends/backends.h"
#include "core/backend.h"
#include "core/rng.h"
#include "test_attention.h"

using namespace st;
using namespace st::attn_ref;

// 3. Stabilized flash: bit-equal to flash where no tile has a tied maximum; close to FP64
// with ties; the underflow cases.

namespace {

// Rows whose every key tile has its top two FP64 scores more than tol + margin apart: no
// rounding of S by less than margin / 2 can make them tie, so the stabilized shift never
// fires and the row must match flash bit for bit.
std::vector<bool> clearly_untied_rows(int T, int d, int bc, const Vec& q, const Vec& k, double tol,
                                      double margin) {
  std::vector<bool> ok(T, true);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int t = 0; t < T; ++t)
    for (int c0 = 0; c0 <= t; c0 += bc) {
      double a = -1e300, b = -1e300;  // largest, second largest
      for (int s = c0; s < std::min(c0 + bc, t + 1); ++s) {
        double x = 0;
        for (int i = 0; i < d; ++i) x += q[t * d + i] * k[s * d + i];
        x *= scale;
        if (x > a) {
          b = a;
          a = x;
        } else {
          b = std::max(b, x);
        }
      }
      if (a - b <= tol + margin) ok[t] = false;
    }
  return ok;
}

}  // namespace

TEST(StabilizedFlash, BitEqualToFlashOnUntiedRows) {
  const int T = kT, d = 64;
  int64_t rows_compared = 0, rows_total = 0;
  for (DType f : {DType::F32, DType::BF16})
    for (RoundingRule rule : {RoundingRule::Gpu, RoundingRule::EveryOp, RoundingRule::EveryMac})
      for (const TileCase& tc : {kTiles[0], kTiles[3]}) {
        const auto heads = make_heads(2, T, d, f, 400 + static_cast<int>(rule));
        AttentionConfig fl = make_cfg(AttentionKind::Flash, rule, tc.br, tc.bc);
        AttentionConfig st = fl;
        st.kind = AttentionKind::StabilizedFlash;
        // margin: BF16 scores of |S| < 16 are off by < 1/32 each; every_mac's BF16 partial
        // sums of q.k can be off by a few tenths.
        const double margin = f == DType::F32 ? 1e-3 : rule == RoundingRule::EveryMac ? 1.0 : 0.1;
        for (const auto& h : heads) {
          const HeadRun a = run_head(fl, fl.numerics(f, 0), T, d, h.q, h.k, h.v, h.dout);
          const HeadRun b = run_head(st, st.numerics(f, 0), T, d, h.q, h.k, h.v, {});
          const auto ok = clearly_untied_rows(T, d, tc.bc, h.q, h.k, fl.tie_tol, margin);
          for (int t = 0; t < T; ++t) {
            ++rows_total;
            if (!ok[t]) continue;
            ++rows_compared;
            EXPECT_EQ(a.fw.lse[t], b.fw.lse[t]) << "row " << t;
            for (int i = 0; i < d; ++i) {
              ASSERT_EQ(a.fw.o[t * d + i], b.fw.o[t * d + i])
                  << dtype_name(f) << " " << rounding_rule_name(rule) << " row " << t;
              ASSERT_EQ(a.fw.o32[t * d + i], b.fw.o32[t * d + i]);
            }
          }
          // The backward is flash's, unchanged: from the same forward it is the same.
          HeadRun c;
          c.dq.assign(a.dq.size(), 0.0);
          c.dk = c.dv = c.dq;
          head_backward(st, st.numerics(f, 0), T, d, h.q.data(), h.k.data(), h.v.data(), a.fw,
                        h.dout.data(), c.dq.data(), c.dk.data(), c.dv.data());
          EXPECT_EQ(c.dq, a.dq);
          EXPECT_EQ(c.dk, a.dk);
          EXPECT_EQ(c.dv, a.dv);
        }
      }
  std::printf("  rows compared bit for bit: %lld of %lld (the rest have a near-tie in some tile)\n",
              static_cast<long long>(rows_compared), static_cast<long long>(rows_total));
  EXPECT_GT(rows_compared, rows_total / 3);
}

TEST(StabilizedFlash, TiedMaximaCloseToFp64) {
  // Keys in identical pairs (in one tile, and straddling a tile boundary) with a large
  // component along a direction w that every query shares, so most rows' maxima are exact
  // ties at r_m > 0 (max logit 4.8 here). Tolerances:
  //   FP32 settings: 1e-6 of max|ref|, as untied rows: the shift (capped at 43.7) keeps every
  //     P~ a normal FP32 number, so P~ keeps FP32's relative precision.
  //   BF16: the flash-attention rule of item 1, 2x baseline's error under the same rule plus
  //     half a BF16 ulp of max|ref|, where S - m is formed in FP32 (gpu, also with the
  //     paper's BF16 accumulator) and for every_op at beta = 2.
  //   every_op at beta = 7 is held to 3x baseline instead (measured 2.9x): there S - m' is
  //     itself rounded to BF16 at |S - m'| ~ (beta - 1) r_m ~ 20-30, where a BF16 ulp is 1/8,
  //     so each P~ carries up to 6% error that beta = 2 (|S - m'| ~ 4, ulp 1/32) and flash
  //     (|S - m| small for the large P~) do not. The same setting with FP32 scores is back
  //     under 2x, which pins the cause.
  const int T = kT, d = 64;
  Rng rng(99);
  Vec w = randn(d, rng);
  Vec q = randn(static_cast<size_t>(T) * d, rng), k = randn(q.size(), rng),
      v = randn(q.size(), rng);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < d; ++i) q[t * d + i] = 0.5 * q[t * d + i] + 0.6 * w[i];
  const int pairs[][2] = {{3, 4}, {10, 11}, {31, 32}, {40, 41}, {60, 61}};
  for (const auto& p : pairs)
    for (int i = 0; i < d; ++i)
      k[p[0] * d + i] = k[p[1] * d + i] = 0.5 * k[p[0] * d + i] + 0.7 * w[i];
  struct Setting {
    DType f;
    RoundingRule rule;
    std::optional<DType> accum, scores;
    double beta, factor;  // limit = factor * baseline error (+ slack) for BF16
    const char* what;
  };
  const Setting settings[] = {
      {DType::F32, RoundingRule::Gpu, {}, {}, 2, 0, "fp32 gpu"},
      {DType::F32, RoundingRule::Gpu, {}, {}, 7, 0, "fp32 gpu"},
      {DType::F32, RoundingRule::EveryOp, {}, {}, 7, 0, "fp32 every_op"},
      {DType::BF16, RoundingRule::Gpu, {}, {}, 2, 2, "bf16 gpu"},
      {DType::BF16, RoundingRule::Gpu, {}, {}, 7, 2, "bf16 gpu"},
      {DType::BF16, RoundingRule::Gpu, DType::BF16, {}, 2, 2, "bf16 gpu accum=bf16"},
      {DType::BF16, RoundingRule::Gpu, DType::BF16, {}, 7, 2, "bf16 gpu accum=bf16"},
      {DType::BF16, RoundingRule::EveryOp, {}, {}, 2, 2, "bf16 every_op"},
      {DType::BF16, RoundingRule::EveryOp, {}, {}, 7, 3, "bf16 every_op"},
      {DType::BF16, RoundingRule::EveryOp, {}, DType::F32, 7, 2, "bf16 every_op scores=fp32"},
  };
  std::printf("  %-26s %-4s %9s %9s %9s %9s  %s\n", "setting", "beta", "baseline", "flash", "stab",
              "limit", "tied rows, rows the shift changed");
  for (const Setting& st : settings) {
    const DType f = st.f;
    const Vec qr = rounded(q, f), kr = rounded(k, f), vr = rounded(v, f);
    const RefHead ref = reference_head(T, d, true, qr, kr, vr, {});
    AttentionConfig bc = make_cfg(AttentionKind::Baseline, st.rule);
    AttentionConfig fc = make_cfg(AttentionKind::Flash, st.rule, 16, 32);
    bc.accum = fc.accum = st.accum;
    bc.scores = fc.scores = st.scores;
    AttentionConfig sc = fc;
    sc.kind = AttentionKind::StabilizedFlash;
    sc.beta = st.beta;
    const Vec ob = forward_head(bc, f, T, d, qr, kr, vr).o;
    const HeadForward ff = forward_head(fc, f, T, d, qr, kr, vr);
    HeadForward fs;
    head_forward(sc, sc.numerics(f, 0), T, d, qr.data(), kr.data(), vr.data(), fs, true);
    const double eb = max_err(ob, ref.o), ef = max_err(ff.o, ref.o), es = max_err(fs.o, ref.o);
    const double limit =
        f == DType::F32 ? 1e-6 * max_abs(ref.o) : st.factor * eb + std::ldexp(max_abs(ref.o), -9);
    int changed = 0;
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < d; ++i)
        if (fs.o32[t * d + i] != ff.o32[t * d + i]) {
          ++changed;
          break;
        }
    std::printf("  %-26s %-4.0f %9.2e %9.2e %9.2e %9.2e  %lld of %d, %d (max logit %.2f)\n",
                st.what, st.beta, eb, ef, es, limit, static_cast<long long>(fs.stats.tied_rows), T,
                changed, fs.stats.max_logit);
    EXPECT_LE(es, limit) << st.what << " beta " << st.beta;
    EXPECT_GT(fs.stats.tied_rows, T / 2) << "the construction should tie most rows";
    EXPECT_GT(changed, T / 2) << "the shift should have changed the rounding of tied rows";
    for (double l : fs.lse) EXPECT_TRUE(std::isfinite(l));
  }
}

namespace {

// d = 1 (scale 1), q = 1 on every row, so S_ts = k_s: the scores are written down directly.
// Key tiles of 4: row 7 sees tiles {k0..k3} and {k4..k7}.
struct Underflow {
  static constexpr int T = 8;
  Vec q = Vec(T, 1.0), k, v = {0.5, -1.25, 2.0, 0.75, -0.5, 1.5, 3.0, -2.0};
  explicit Underflow(Vec keys) : k(std::move(keys)) {}
  HeadForward run(const AttentionConfig& cfg, DType f) const {
    return forward_head(cfg, f, T, 1, q, k, v);
  }
  // The FP64 softmax of the inputs as format f holds them.
  RefHead ref(DType f) const {
    return reference_head(T, 1, true, rounded(q, f), rounded(k, f), rounded(v, f), {});
  }
};

AttentionConfig stab_cfg(RoundingRule rule, double beta, double max_shift = 0.0) {
  AttentionConfig c = make_cfg(AttentionKind::StabilizedFlash, rule, 4, 4);
  c.beta = beta;
  c.max_shift = max_shift;
  return c;
}

bool all_finite(const Vec& x) {
  return std::all_of(x.begin(), x.end(), [](double a) { return std::isfinite(a); });
}

}  // namespace

TEST(StabilizedFlash, MaxShiftDefaults) {
  // Default cap ln(1 / min_normal(probs)) / 2: 63 ln 2 for BF16 and FP32 (min normal
  // 2^-126), 7 ln 2 for FP16 (2^-14); an explicit max_shift is used as given.
  AttentionConfig c;
  EXPECT_NEAR(stabilized_max_shift(c, DType::BF16), 63 * std::log(2.0), 1e-12);
  EXPECT_NEAR(stabilized_max_shift(c, DType::F32), 63 * std::log(2.0), 1e-12);
  EXPECT_NEAR(stabilized_max_shift(c, DType::F16), 7 * std::log(2.0), 1e-12);
  c.max_shift = 12.5;
  EXPECT_EQ(stabilized_max_shift(c, DType::F16), 12.5);
  EXPECT_EQ(stabilized_max_shift(c, DType::BF16), 12.5);
}

TEST(StabilizedFlash, UnderflowLargePositiveTiedMaximum) {
  // beta = 7, tied maximum r_m = 20 (keys 0, 1, and key 4 equal to it in the next tile):
  // uncapped, m' = 140 and every P~ = exp(<= -120) is 0 in FP32 (smallest subnormal 1.4e-45),
  // so l = 0 and O = 0/0. The default cap (43.67) keeps the tied P~ = exp(-43.67) ~ 1e-19.
  const Underflow u({20, 20, 17.5, 12, 20, 5, -3, 19.5});
  for (DType f : {DType::F32, DType::BF16}) {
    const RefHead ref = u.ref(f);
    const RoundingRule rule = RoundingRule::Gpu;
    const HeadForward s = u.run(stab_cfg(rule, 7.0), f);
    const HeadForward b = u.run(make_cfg(AttentionKind::Baseline, rule), f);
    ASSERT_TRUE(all_finite(s.o) && all_finite(s.lse)) << dtype_name(f) << ": l = 0 or NaN";
    const double err = max_err(s.o, ref.o), eb = max_err(b.o, ref.o);
    std::printf(
        "  r_m = 20, beta = 7, %s: max|O - ref| = %.2e (baseline %.2e), max|lse - ref| = %.2e\n",
        dtype_name(f), err, eb, max_err(s.lse, ref.lse));
    if (f == DType::F32) {
      EXPECT_LT(err, 1e-6 * max_abs(ref.o));
      EXPECT_LT(max_err(s.lse, ref.lse), 1e-5);  // |lse| ~ 20: a few FP32 ulps
    } else {
      EXPECT_LE(err, 2 * eb + std::ldexp(max_abs(ref.o), -9));
    }
  }
  const RefHead ref = u.ref(DType::F32);
  // Explicit max_shift values are used as given: 80 still leaves exp(-80) = 1.8e-35 a normal
  // FP32 number (fine); 1000 does not cap the shift of 120, and the row collapses to l = 0.
  EXPECT_LT(max_err(u.run(stab_cfg(RoundingRule::Gpu, 7.0, 80.0), DType::F32).o, ref.o),
            1e-6 * max_abs(ref.o));
  const HeadForward bad = u.run(stab_cfg(RoundingRule::Gpu, 7.0, 1000.0), DType::F32);
  EXPECT_TRUE(std::isnan(bad.o[7])) << "without the cap exp(-120) underflows: l = 0, O = 0/0";
  EXPECT_EQ(bad.lse[7], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(bad.o[0], u.v[0]) << "row 0 has no tie and is untouched";
  // Below the cap the cap changes nothing: beta = 2 at r_m = 20 shifts by 20 < 43.67.
  EXPECT_EQ(u.run(stab_cfg(RoundingRule::Gpu, 2.0), DType::BF16).o,
            u.run(stab_cfg(RoundingRule::Gpu, 2.0, 1e9), DType::BF16).o);
}

TEST(StabilizedFlash, UnderflowLargeNegativeTiedMaximum) {
  // Tied maximum at -200: the rule asks for m' = 0, a shift of 200, and exp(-200) is 0 in
  // FP32 and BF16. Capped at 43.67: m' = -156.3, the tied P~ = exp(-43.67).
  const Underflow u({-200, -200, -203, -210, -200, -230, -250, -200.5});  // -200.5: BF16 -200
  for (DType f : {DType::F32, DType::BF16})
    for (RoundingRule rule : {RoundingRule::Gpu, RoundingRule::EveryOp}) {
      const RefHead ref = u.ref(f);
      const HeadForward s = u.run(stab_cfg(rule, 2.0), f);
      const HeadForward b = u.run(make_cfg(AttentionKind::Baseline, rule), f);
      ASSERT_TRUE(all_finite(s.o) && all_finite(s.lse)) << dtype_name(f);
      const double err = max_err(s.o, ref.o), eb = max_err(b.o, ref.o);
      std::printf("  r_m = -200, %s %s: max|O - ref| = %.2e (baseline %.2e)\n", dtype_name(f),
                  rounding_rule_name(rule), err, eb);
      if (f == DType::F32)
        EXPECT_LT(err, 1e-6 * max_abs(ref.o));
      else
        EXPECT_LE(err, 2 * eb + std::ldexp(max_abs(ref.o), -9));
    }
  const HeadForward bad = u.run(stab_cfg(RoundingRule::Gpu, 2.0, 1000.0), DType::F32);
  EXPECT_TRUE(std::isnan(bad.o[7])) << "uncapped m' = 0: exp(-200) = 0, l = 0";
}

TEST(StabilizedFlash, Fp16ProbsCap) {
  // FP16 P~ (min normal 2^-14): the cap is 7 ln 2 = 4.85, so a tied maximum's P~ is
  // exp(-7 ln 2) = 2^-7 exactly after rounding, a normal FP16 number. Uncapped, beta = 2 at
  // r_m = 20 would give exp(-20) = 2e-9, below FP16's smallest subnormal (6e-8): l = 0.
  const Underflow u({20, 20, 17.5, 12, 20, 5, -3, 19.5});
  const RefHead ref = u.ref(DType::F16);
  const HeadForward s = u.run(stab_cfg(RoundingRule::Gpu, 2.0), DType::F16);
  const HeadForward b = u.run(make_cfg(AttentionKind::Baseline, RoundingRule::Gpu), DType::F16);
  const HeadForward fl = u.run(make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 4, 4), DType::F16);
  ASSERT_TRUE(all_finite(s.o) && all_finite(s.lse));
  const double err = max_err(s.o, ref.o), eb = max_err(b.o, ref.o);
  std::printf("  fp16 probs, r_m = 20: max|O - ref| stabilized %.2e, flash %.2e, baseline %.2e\n",
              err, max_err(fl.o, ref.o), eb);
  // FP16 rule: 2x baseline plus half an FP16 ulp of max|ref|.
  EXPECT_LE(err, 2 * eb + std::ldexp(max_abs(ref.o), -12));
  // The tied P~ of row 1 (keys 0 and 1, both 2^-7) sum exactly: l = 2^-6 in FP32, and
  // lse = m' + log(l) = (20 + 7 ln 2) - 6 ln 2, within FP32 rounding of m'.
  EXPECT_NEAR(s.lse[1], 20 + std::log(2.0), 4e-6);
  const HeadForward bad = u.run(stab_cfg(RoundingRule::Gpu, 2.0, 1000.0), DType::F16);
  EXPECT_TRUE(std::isnan(bad.o[7])) << "uncapped: exp(-20) is 0 in FP16";
}
