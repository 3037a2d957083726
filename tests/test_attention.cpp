// Attention numerics against independent references (issue 5, "What must be shown" 1-3,
// plus the statistics and the Attention class's per-head and delta-mode switches).
//   1. An FP64 softmax attention and its analytic backward, written here, judge every backend
//      (baseline, flash, stabilized flash) forward and backward: FP32 settings to < 1e-6
//      (O) / 4e-6 (gradients) of max|ref|; BF16 by the flash-attention rule
//      max|out - ref| <= 2 max|baseline_same_rule - ref| (RESEARCH.md section 3).
//      round_fmt(double) against a frexp/nearbyint rounding written here, on every BF16/FP16
//      midpoint and one double ulp either side (where double -> float -> bf16 double-rounds).
//   2. Hand-worked cases for each rounding rule, forward and backward, and the Qiu & Yao bit
//      example: every intermediate value written out in the comments, results asserted ==.
//   3. Stabilized flash: bit-equal to flash on untied rows, near FP64 with ties, the
//      underflow cap (beta r_m large, r_m very negative, FP16 P~).
//   4, 5. Statistics on constructed scores; the Attention class's packing, fp32_out_heads and
//      delta modes.
// Every figure the assertions judge is printed.
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

using namespace st;

namespace {

using Vec = std::vector<double>;

Vec randn(size_t n, Rng& rng, double scale = 1.0) {
  Vec x(n);
  for (double& v : x) v = scale * rng.normal();
  return x;
}

Vec rounded(const Vec& x, DType f) {
  Vec r(x);
  for (double& v : r) v = round_fmt(v, f);
  return r;
}

double max_abs(const Vec& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// max |a - b|; NaN anywhere (or a size mismatch) counts as infinite error.
double max_err(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - b[i]);
    if (std::isnan(e)) return std::numeric_limits<double>::infinity();
    m = std::max(m, e);
  }
  return m;
}

// max|a - ref| / max|ref| (absolute where ref is all zero, e.g. dQ, dK at T = 1).
double rel_err(const Vec& a, const Vec& ref) {
  const double m = max_abs(ref);
  return max_err(a, ref) / (m > 0 ? m : 1.0);
}

// ---- The independent FP64 reference: plain softmax attention and its analytic backward.
struct RefHead {
  Vec o, lse, dq, dk, dv, delta;  // delta_t = rowsum(dO * O) = rowsum(dP * P), exact
};

RefHead reference_head(int T, int d, bool causal, const Vec& q, const Vec& k, const Vec& v,
                       const Vec& dout) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  RefHead r;
  r.o.assign(static_cast<size_t>(T) * d, 0.0);
  r.lse.assign(T, 0.0);
  r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(r.o.size(), 0.0);
  r.dv.assign(r.o.size(), 0.0);
  r.delta.assign(T, 0.0);
  Vec P(static_cast<size_t>(T) * T, 0.0), dS(P.size(), 0.0);
  for (int t = 0; t < T; ++t) {
    const int n = causal ? t + 1 : T;
    Vec s(n);
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += q[t * d + i] * k[j * d + i];
      s[j] = acc * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += std::exp(s[j] - mx);
    r.lse[t] = mx + std::log(sum);
    for (int j = 0; j < n; ++j) P[t * T + j] = std::exp(s[j] - mx) / sum;
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < d; ++i) r.o[t * d + i] += P[t * T + j] * v[j * d + i];
    if (dout.empty()) continue;
    // dP_tj = dO_t . v_j; dS = P * (dP - sum_j P dP).
    Vec dP(n);
    double D = 0;
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += dout[t * d + i] * v[j * d + i];
      dP[j] = acc;
      D += P[t * T + j] * acc;
    }
    r.delta[t] = D;
    for (int j = 0; j < n; ++j) dS[t * T + j] = P[t * T + j] * (dP[j] - D);
  }
  if (dout.empty()) return r;
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < T; ++j) {
      const double w = dS[t * T + j], p = P[t * T + j];
      if (w == 0 && p == 0) continue;
      for (int i = 0; i < d; ++i) {
        r.dq[t * d + i] += scale * w * k[j * d + i];
        r.dk[j * d + i] += scale * w * q[t * d + i];
        r.dv[j * d + i] += p * dout[t * d + i];
      }
    }
  return r;
}

// One head through head_forward + head_backward.
struct HeadRun {
  HeadForward fw;
  Vec dq, dk, dv;
};

HeadRun run_head(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d, const Vec& q,
                 const Vec& k, const Vec& v, const Vec& dout) {
  HeadRun r;
  head_forward(cfg, n, T, d, q.data(), k.data(), v.data(), r.fw);
  if (!dout.empty()) {
    const size_t td = static_cast<size_t>(T) * d;
    r.dq.assign(td, std::nan(""));  // poisoned: unwritten elements fail the comparison
    r.dk.assign(td, std::nan(""));
    r.dv.assign(td, std::nan(""));
    head_backward(cfg, n, T, d, q.data(), k.data(), v.data(), r.fw, dout.data(), r.dq.data(),
                  r.dk.data(), r.dv.data());
  }
  return r;
}

AttentionConfig make_cfg(AttentionKind kind, RoundingRule rule, int br = 16, int bc = 32) {
  AttentionConfig c;
  c.kind = kind;
  c.rule = rule;
  c.block_q = br;
  c.block_k = bc;
  return c;
}

const AttentionKind kKinds[] = {AttentionKind::Baseline, AttentionKind::Flash,
                                AttentionKind::StabilizedFlash};

// Errors of one run against the reference: O, dQ, dK, dV.
struct Errs {
  double o = 0, dq = 0, dk = 0, dv = 0;
  void max_with(const HeadRun& r, const RefHead& ref) {
    o = std::max(o, max_err(r.fw.o, ref.o));
    dq = std::max(dq, max_err(r.dq, ref.dq));
    dk = std::max(dk, max_err(r.dk, ref.dk));
    dv = std::max(dv, max_err(r.dv, ref.dv));
  }
};

// Random heads for the reference comparisons: inputs already in format f so the reference
// sees exactly what the kernels see.
struct HeadInputs {
  Vec q, k, v, dout;
  RefHead ref;
};

std::vector<HeadInputs> make_heads(int count, int T, int d, DType f, uint64_t seed,
                                   bool causal = true) {
  Rng rng(seed);
  std::vector<HeadInputs> hs(count);
  const size_t td = static_cast<size_t>(T) * d;
  for (auto& h : hs) {
    // q scaled up so the softmax rows are peaked (scores ~ N(0, 2^2)), as trained heads are.
    h.q = rounded(randn(td, rng, 2.0), f);
    h.k = rounded(randn(td, rng), f);
    h.v = rounded(randn(td, rng), f);
    h.dout = rounded(randn(td, rng), f);
    h.ref = reference_head(T, d, causal, h.q, h.k, h.v, h.dout);
  }
  return hs;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// 1. Every backend, forward and backward, against the FP64 reference.

struct TileCase {
  int br, bc;
  const char* what;
};
// T = 77 is no multiple of any tile; Br < Bc leaves key columns of a tile masked for a whole
// query tile; Br > Bc gives key tiles fully masked for the first rows of a query tile (the
// backward skips them); 0 is one tile per row; 1 x 5 is many rescaling steps.
const TileCase kTiles[] = {{16, 32, "16x32"}, {32, 16, "32x16"}, {0, 0, "one tile"}, {1, 5, "1x5"}};
constexpr int kT = 77;
constexpr int kHeads = 3;  // independent random heads per setting (max error over them)

TEST(AttentionReference, Fp64SettingsMatchTo1e12) {
  // Every format FP64: the backends are exact algorithms, so they agree with the reference
  // to rounding noise of double arithmetic. Causal and not, T = 77, and the edge lengths
  // T = 1 (a single key) and T = 2, 33 against the same tiles.
  double worst = 0;
  for (bool causal : {true, false})
    for (int T : {kT, 1, 2, 33})
      for (int d : {32, 64, 128}) {
        if (T != kT && d != 32) continue;
        const auto heads = make_heads(1, T, d, DType::F64, 100 + d + T, causal);
        const auto& h = heads[0];
        for (AttentionKind kind : kKinds)
          for (const TileCase& tc : kTiles) {
            if (kind == AttentionKind::Baseline && tc.br != 16) continue;
            AttentionConfig cfg = make_cfg(kind, RoundingRule::Gpu, tc.br, tc.bc);
            cfg.causal = causal;
            const HeadRun r =
                run_head(cfg, cfg.numerics(DType::F64, 0), T, d, h.q, h.k, h.v, h.dout);
            const double e[] = {rel_err(r.fw.o, h.ref.o), rel_err(r.fw.lse, h.ref.lse),
                                rel_err(r.dq, h.ref.dq), rel_err(r.dk, h.ref.dk),
                                rel_err(r.dv, h.ref.dv)};
            for (int i = 0; i < 5; ++i) {
              const double x = e[i];
              EXPECT_LT(x, 1e-12) << attention_kind_name(kind) << " causal " << causal << " T=" << T
                                  << " d=" << d << " " << tc.what << " output " << i;
              worst = std::max(worst, x);
            }
          }
      }
  std::printf("  FP64 settings: worst relative error %.2e\n", worst);
}

TEST(AttentionReference, Fp32SettingsFarUnder1e5) {
  // All formats FP32 (qkv, scores, probs, accum, out, grads, mac). Error is normalised by
  // max |ref| of the same quantity. Bounds: 1e-6 for O and lse, 4e-6 for the gradients
  // (measured worst 2.0e-6, flash dK at d = 128, 1x5 tiles). Scores reach |S| ~ 8, where one
  // FP32 ulp of S (or of the FP32 lse that flash's backward recomputes P from) is ~5e-7
  // relative in P, and dS = P (dP - delta) loses a few more bits to cancellation.
  std::printf("  FP32 settings, T=%d, max|x - ref| / max|ref| (max over %d heads):\n", kT, kHeads);
  std::printf("  %-17s %-9s %4s %9s %9s %9s %9s %9s\n", "backend", "rule", "d", "tiles", "O", "dQ",
              "dK", "dV");
  double worst = 0;
  for (RoundingRule rule : {RoundingRule::Gpu, RoundingRule::EveryMac})
    for (int d : {32, 64, 128}) {
      const auto heads = make_heads(kHeads, kT, d, DType::F32, 200 + d);
      for (AttentionKind kind : kKinds)
        for (const TileCase& tc : kTiles) {
          if (kind == AttentionKind::Baseline && tc.br != 16) continue;
          const AttentionConfig cfg = make_cfg(kind, rule, tc.br, tc.bc);
          const AttnNumerics n = cfg.numerics(DType::F32, 0);
          double e[4] = {0, 0, 0, 0};
          for (const auto& h : heads) {
            const HeadRun r = run_head(cfg, n, kT, d, h.q, h.k, h.v, h.dout);
            e[0] = std::max(e[0], max_err(r.fw.o, h.ref.o) / max_abs(h.ref.o));
            e[1] = std::max(e[1], max_err(r.dq, h.ref.dq) / max_abs(h.ref.dq));
            e[2] = std::max(e[2], max_err(r.dk, h.ref.dk) / max_abs(h.ref.dk));
            e[3] = std::max(e[3], max_err(r.dv, h.ref.dv) / max_abs(h.ref.dv));
            EXPECT_LT(max_err(r.fw.lse, h.ref.lse) / max_abs(h.ref.lse), 1e-6);
            EXPECT_GT(max_abs(r.fw.o), 0.0);
          }
          std::printf("  %-17s %-9s %4d %9s %9.2e %9.2e %9.2e %9.2e\n", attention_kind_name(kind),
                      rounding_rule_name(rule), d, kind == AttentionKind::Baseline ? "-" : tc.what,
                      e[0], e[1], e[2], e[3]);
          for (int i = 0; i < 4; ++i) {
            EXPECT_LT(e[i], i == 0 ? 1e-6 : 4e-6)
                << attention_kind_name(kind) << " d=" << d << " " << tc.what << " output " << i;
            worst = std::max(worst, e[i]);
          }
        }
    }
  std::printf("  worst FP32 relative error: %.2e\n", worst);
}

TEST(AttentionReference, Bf16WithinTwiceBaseline) {
  // Flash and stabilized flash under a rule must stay within 2x the error baseline makes
  // under the same rule (forward O and each gradient), against the FP64 reference on the
  // same BF16 inputs. Slack: 2^-9 max|ref| (at most half a BF16 ulp of the largest output),
  // so that a max error of one rounding of a stored value cannot fail on a coin flip; no
  // asserted case needs it today (worst ratio 1.93).
  // Not asserted (printed, marked *): every_op with Br = 1. Under every_op the accumulator
  // format is BF16, and flash's backward adds each query tile's partial dK, dV into it, so
  // Br = 1 rounds dK, dV 77 times where baseline rounds its one GEMM once: measured 2.4-3.6x
  // baseline. That is the rule's definition at work, not a kernel error: gpu (FP32
  // accumulators) stays under 2x with the same tiles, and so does every_mac, where baseline's
  // own GEMMs round every multiply-add to BF16 as well.
  std::printf("  BF16, T=%d: max|x - ref| (max over %d heads) and ratio to baseline:\n", kT,
              kHeads);
  std::printf("  %-17s %-9s %4s %9s %17s %17s %17s %17s\n", "backend", "rule", "d", "tiles", "O",
              "dQ", "dK", "dV");
  for (RoundingRule rule : {RoundingRule::Gpu, RoundingRule::EveryOp, RoundingRule::EveryMac})
    for (int d : {32, 64, 128}) {
      const auto heads = make_heads(kHeads, kT, d, DType::BF16, 300 + d);
      double ref_max[4] = {0, 0, 0, 0};
      for (const auto& h : heads) {
        ref_max[0] = std::max(ref_max[0], max_abs(h.ref.o));
        ref_max[1] = std::max(ref_max[1], max_abs(h.ref.dq));
        ref_max[2] = std::max(ref_max[2], max_abs(h.ref.dk));
        ref_max[3] = std::max(ref_max[3], max_abs(h.ref.dv));
      }
      Errs base;
      {
        const AttentionConfig cfg = make_cfg(AttentionKind::Baseline, rule);
        for (const auto& h : heads)
          base.max_with(run_head(cfg, cfg.numerics(DType::BF16, 0), kT, d, h.q, h.k, h.v, h.dout),
                        h.ref);
      }
      std::printf("  %-17s %-9s %4d %9s %9.2e        %9.2e        %9.2e        %9.2e\n", "baseline",
                  rounding_rule_name(rule), d, "-", base.o, base.dq, base.dk, base.dv);
      for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
        for (const TileCase& tc : kTiles) {
          const AttentionConfig cfg = make_cfg(kind, rule, tc.br, tc.bc);
          Errs e;
          for (const auto& h : heads)
            e.max_with(run_head(cfg, cfg.numerics(DType::BF16, 0), kT, d, h.q, h.k, h.v, h.dout),
                       h.ref);
          const double got[4] = {e.o, e.dq, e.dk, e.dv},
                       lim[4] = {base.o, base.dq, base.dk, base.dv};
          std::printf("  %-17s %-9s %4d %9s", attention_kind_name(kind), rounding_rule_name(rule),
                      d, tc.what);
          for (int i = 0; i < 4; ++i) std::printf(" %9.2e (%4.2f)", got[i], got[i] / lim[i]);
          std::printf("\n");
          static const char* names[4] = {"O", "dQ", "dK", "dV"};
          if (rule == RoundingRule::EveryOp && tc.br == 1) {
            std::printf("  * not asserted: BF16 dK/dV accumulator over %d query tiles\n", kT);
            EXPECT_LE(e.o, 2 * base.o + std::ldexp(ref_max[0], -9));  // the forward still is
            continue;
          }
          for (int i = 0; i < 4; ++i)
            EXPECT_LE(got[i], 2 * lim[i] + std::ldexp(ref_max[i], -9))
                << attention_kind_name(kind) << " " << rounding_rule_name(rule) << " d=" << d
                << " tiles " << tc.what << " " << names[i];
        }
    }
}

// ---------------------------------------------------------------------------------------
// round_fmt(double, f) against an independent correctly-rounded reference and against the
// float path (round_bf16 / round_fp16 of floats).

namespace {

struct Fmt {
  DType t;
  int p;        // significand bits, implicit bit included
  int emin;     // exponent of the smallest normal
  double maxv;  // largest finite value
};
const Fmt kBf16{DType::BF16, 8, -126, 0x1.fep127};
const Fmt kFp16{DType::F16, 11, -14, 65504.0};

// RNE of a double to f, independent of round_fmt: scale by a power of two so the quantum of
// x's binade (or of the subnormal range) is 1, round to an integer (nearbyint: ties to even
// in the default rounding mode; exact because the scaled value is a double below 2^p+1),
// scale back. Overflow: a rounded magnitude above maxv is Inf (IEEE RNE).
double ref_round(double x, const Fmt& f) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int lead = std::max(e - 1, f.emin);
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, f.p - 1 - lead)), lead - (f.p - 1));
  return std::fabs(r) > f.maxv ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
}

// All finite, non-negative values of the format, ascending (bit patterns 0 .. Inf - 1).
std::vector<double> all_values(const Fmt& f) {
  std::vector<double> v;
  for (uint32_t b = 0; b < 0x8000u; ++b) {
    const float x = f.t == DType::BF16 ? bf16_bits_to_float(static_cast<uint16_t>(b))
                                       : fp16_bits_to_float(static_cast<uint16_t>(b));
    if (!std::isfinite(x)) break;
    v.push_back(x);
  }
  return v;
}

float float_path(float x, DType t) {
  return t == DType::BF16 ? round_bf16(x) : round_fp16(x);
}

}  // namespace

TEST(RoundFmt, MidpointsPlusMinusOneDoubleUlpNoDoubleRounding) {
  // Every pair of adjacent values a < b (and the overflow midpoint maxv + ulp/2) in both signs:
  // the exact midpoint rounds to the even one, the doubles one ulp either side to the nearer.
  // m + 1 ulp is not a float, and double -> float rounds it back to m; a naive
  // double -> float -> bf16 path then ties to even and can return a instead of b. Count those
  // to show the test can tell.
  for (const Fmt& f : {kBf16, kFp16}) {
    const auto vals = all_values(f);
    int64_t checked = 0, naive_wrong = 0, bad = 0;
    for (size_t i = 0; i + 1 <= vals.size(); ++i) {
      const double a = vals[i];
      const double b = i + 1 < vals.size() ? vals[i + 1] : 2 * vals[i] - vals[i - 1];  // maxv+ulp
      const double m = 0.5 * (a + b);  // exact: a, b have <= 11 significant bits
      for (double sgn : {1.0, -1.0}) {
        for (double x : {m, std::nextafter(m, 0.0), std::nextafter(m, 1e300)}) {
          x *= sgn;
          const double want = ref_round(x, f), got = round_fmt(x, f.t);
          ++checked;
          if (!(got == want && std::signbit(got) == std::signbit(want)) && bad++ < 5)
            ADD_FAILURE() << dtype_name(f.t) << " round_fmt(" << x << ") = " << got << ", want "
                          << want;
          if (static_cast<double>(float_path(static_cast<float>(x), f.t)) != want) ++naive_wrong;
        }
        // The midpoint itself is a tie: the even neighbour (and Inf above maxv).
        const double even = (i + 1 == vals.size())
                                ? std::numeric_limits<double>::infinity()
                                : (((i & 1) == 0) ? a : b);  // bit pattern i is a's
        EXPECT_EQ(round_fmt(sgn * m, f.t), sgn * even) << dtype_name(f.t) << " tie at " << m;
      }
    }
    std::printf(
        "  %s: %lld midpoint cases, round_fmt wrong in %lld; the naive double->float->%s"
        " path is wrong in %lld\n",
        dtype_name(f.t), static_cast<long long>(checked), static_cast<long long>(bad),
        dtype_name(f.t), static_cast<long long>(naive_wrong));
    EXPECT_EQ(bad, 0);
    EXPECT_GT(naive_wrong, 1000) << "the midpoint cases do not exercise double rounding";
  }
}

TEST(RoundFmt, RandomDoublesAgainstReference) {
  // 2^21 random doubles per format: random 52-bit significands (so nearly all are inexact in
  // FP32 too), exponents across the format's whole range including subnormals, underflow to
  // zero and overflow to Inf. Plus specials.
  Rng rng(7);
  for (const Fmt& f : {kBf16, kFp16}) {
    const int lo = f.emin - f.p - 3, hi = std::ilogb(f.maxv) + 3;
    int bad = 0;
    for (int i = 0; i < (1 << 21); ++i) {
      const double sig = 1.0 + rng.uniform();
      const int e = lo + static_cast<int>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
      const double x = (rng.below(2) ? -1.0 : 1.0) * std::ldexp(sig, e);
      const double want = ref_round(x, f), got = round_fmt(x, f.t);
      if (!(got == want && std::signbit(got) == std::signbit(want)) && bad++ < 5)
        ADD_FAILURE() << dtype_name(f.t) << " round_fmt(" << x << ") = " << got << ", want "
                      << want;
    }
    EXPECT_EQ(bad, 0) << dtype_name(f.t);
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_EQ(round_fmt(inf, f.t), inf);
    EXPECT_EQ(round_fmt(-inf, f.t), -inf);
    EXPECT_TRUE(std::isnan(round_fmt(std::nan(""), f.t)));
    EXPECT_EQ(round_fmt(1e300, f.t), inf);
    EXPECT_TRUE(std::signbit(round_fmt(-1e-300, f.t)) && round_fmt(-1e-300, f.t) == 0.0);
  }
  // FP32 and FP64: the hardware conversion, RNE from the double.
  EXPECT_EQ(round_fmt(1.0 + 0x1p-24, DType::F32), 1.0);                      // tie -> even
  EXPECT_EQ(round_fmt(1.0 + 0x1p-24 + 0x1p-52, DType::F32), 1.0 + 0x1p-23);  // just above
  EXPECT_EQ(round_fmt(1.0 + 0x1p-52, DType::F64), 1.0 + 0x1p-52);
}

TEST(RoundFmt, AgreesWithFloatPath) {
  // For doubles that are floats, round_fmt must be the float conversions bit for bit: every
  // upper 16 bits with the BF16 boundary patterns below them, every upper 19 bits with the
  // FP16 normal-range boundary patterns (13 dropped bits), and 2^22 random floats.
  auto same = [](float x, DType t) {
    const float want = float_path(x, t);
    const double got = round_fmt(static_cast<double>(x), t);
    if (std::isnan(want)) return std::isnan(got);
    return got == static_cast<double>(want) && std::signbit(got) == std::signbit(want);
  };
  int bad = 0;
  int64_t n = 0;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float x = bits_float(hi << 16 | lo);
      ++n;
      if (!same(x, DType::BF16) && bad++ < 5)
        ADD_FAILURE() << "bf16 bits " << std::hex << (hi << 16 | lo);
    }
  for (uint32_t hi = 0; hi < 0x80000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu}) {
      const float x = bits_float(hi << 13 | lo);
      ++n;
      if (!same(x, DType::F16) && bad++ < 5)
        ADD_FAILURE() << "fp16 bits " << std::hex << (hi << 13 | lo);
    }
  Rng rng(11);
  for (int i = 0; i < (1 << 22); ++i) {
    const float x = bits_float(static_cast<uint32_t>(rng.next_u64()));
    n += 2;
    if (!same(x, DType::BF16) && bad++ < 5) ADD_FAILURE() << "bf16 " << x;
    if (!same(x, DType::F16) && bad++ < 5) ADD_FAILURE() << "fp16 " << x;
  }
  std::printf("  %lld float inputs, round_fmt vs round_bf16/round_fp16: %d mismatches\n",
              static_cast<long long>(n), bad);
  EXPECT_EQ(bad, 0);
}

TEST(RoundFmt, FractionBitsAgainstReference) {
  // round_fraction_bits(x, N), the format of attention.o_tilde_bits (FP32's exponent range,
  // N fraction bits), against ref_round with p = N + 1, emin = -126: random doubles over the
  // whole range (subnormals, underflow, overflow) and the midpoints of adjacent values, one
  // double ulp either side; N = 7 is BF16 and must equal round_fmt's BF16.
  Rng rng(13);
  const double inf = std::numeric_limits<double>::infinity();
  for (int N : {1, 2, 3, 4, 6, 7, 10, 16, 21}) {
    const Fmt f{DType::F32, N + 1, -126, std::ldexp(2.0 - std::ldexp(1.0, -N), 127)};
    int bad = 0;
    auto check = [&](double x) {
      const double want = ref_round(x, f), got = round_fraction_bits(x, N);
      if (!(got == want && std::signbit(got) == std::signbit(want)) && bad++ < 5)
        ADD_FAILURE() << "N=" << N << " round_fraction_bits(" << x << ") = " << got
                      << ", want " << want;
      if (N == 7 && !(got == round_fmt(x, DType::BF16)) && bad++ < 5)
        ADD_FAILURE() << "N=7 differs from bf16 at " << x;
    };
    const int lo = -126 - N - 3, hi = 130;
    for (int i = 0; i < (1 << 18); ++i) {
      const int e = lo + static_cast<int>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
      const double sgn = rng.below(2) ? -1.0 : 1.0;
      check(sgn * std::ldexp(1.0 + rng.uniform(), e));
      // A midpoint of two neighbours at exponent e (quantum 2^(max(e,-126) - N)), and the
      // doubles next to it.
      const double q = std::ldexp(1.0, std::max(e, -126) - N);
      const double a = std::floor(std::ldexp(1.0 + rng.uniform(), e) / q) * q;
      for (double x : {a + q / 2, std::nextafter(a + q / 2, 0.0), std::nextafter(a + q / 2, inf)})
        check(sgn * x);
    }
    EXPECT_EQ(bad, 0) << "N=" << N;
    EXPECT_EQ(round_fraction_bits(inf, N), inf);
    EXPECT_EQ(round_fraction_bits(-1e300, N), -inf);
    EXPECT_TRUE(std::isnan(round_fraction_bits(std::nan(""), N)));
    EXPECT_TRUE(std::signbit(round_fraction_bits(-1e-300, N)));
  }
  // Hand-checked: 1 + 3/16 with 3 fraction bits is a tie between 1.125 and 1.25: to even.
  EXPECT_EQ(round_fraction_bits(1.1875, 3), 1.25);
  EXPECT_EQ(round_fraction_bits(1.0625, 3), 1.0);  // tie between 1 and 1.125: to even (1)
  EXPECT_EQ(round_fraction_bits(1.0625 + 0x1p-40, 3), 1.125);
  EXPECT_THROW(round_fraction_bits(1.0, 0), Error);
  EXPECT_THROW(round_fraction_bits(1.0, 22), Error);
}

// ---------------------------------------------------------------------------------------
// 2. Hand-worked spec cases: each rounding point of head_cpu.cpp's header comment, worked
// step by step for inputs small enough to follow (values checked with exact rational
// arithmetic; "R" is RNE to BF16, every listed value is exact). Asserted with ==.

namespace {

HeadForward forward_head(const AttentionConfig& cfg, DType f, int T, int d, const Vec& q,
                         const Vec& k, const Vec& v) {
  HeadForward fw;
  head_forward(cfg, cfg.numerics(f, 0), T, d, q.data(), k.data(), v.data(), fw);
  return fw;
}

// T = 3 causal rows, d = 4 (two live components, so scale = 1/sqrt(4) = 0.5 exactly), every
// row's query the same, flash key tiles of 2 (keys {0,1} then {2}).
//   q    = (-0.8125, 0.875, 0, 0)
//   k0   = ( 3.625,  5.25 ),  k1 = (-3.375, 6.25 ),  k2 = (-1.625, 1.4375)
//   v0   = (-7.75,   1.9375), v1 = ( 0.5625, -6.0), v2 = (-3.0,  -7.0)
// q.k exact: 1.6484375, 8.2109375, 2.578125 (products -2.9453125 + 4.59375, 2.7421875 +
// 5.46875, 1.3203125 + 1.2578125).
std::vector<double> rules_case_row2(const AttentionConfig& cfg) {
  const Vec q = {-0.8125, 0.875, 0, 0, -0.8125, 0.875, 0, 0, -0.8125, 0.875, 0, 0};
  const Vec k = {3.625, 5.25, 0, 0, -3.375, 6.25, 0, 0, -1.625, 1.4375, 0, 0};
  const Vec v = {-7.75, 1.9375, 0, 0, 0.5625, -6.0, 0, 0, -3.0, -7.0, 0, 0};
  const HeadForward fw = forward_head(cfg, DType::BF16, 3, 4, q, k, v);
  // Row 0 sees key 0 only: P~ = exp(0) = 1, l = 1, O = v0 under every rule and backend.
  EXPECT_EQ(fw.o[0], -7.75);
  EXPECT_EQ(fw.o[1], 1.9375);
  EXPECT_EQ(fw.o[8 + 2], 0.0);
  EXPECT_EQ(fw.o[8 + 3], 0.0);
  return {fw.o[8], fw.o[9]};
}

}  // namespace

TEST(AttentionSpec, RulesHandWorked) {
  using V2 = std::vector<double>;
  AttentionConfig c = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 2, 2);
  // S at each rule (S = R_s(0.5 * R_s(q.k)), q.k accumulated in mac):
  //   FP32 scores (flash gpu):     q.k exact -> S = 0.82421875, 4.10546875, 1.2890625
  //   BF16 scores (flash every_op, baseline gpu/every_op): R(8.2109375) = 8.1875 (every_op
  //     rounds q.k itself) or R(4.10546875) = 4.09375 (baseline gpu rounds S): both give
  //     S = 0.82421875, 4.09375, 1.2890625
  //   BF16 mac (every_mac): partial sums rounded: R(-2.9453125) = -2.9375 (tie, even), then
  //     R(1.65625); R(2.7421875) = 2.75 (tie, even), then R(8.21875) = 8.25 (tie, even);
  //     2.578125 exact -> S = 0.828125, 4.125, 1.2890625
  //
  // flash, gpu (S, m, l, O~ FP32; P~ and O BF16):
  //   tile {0,1}: m = 4.10546875; P~ = R(exp(-3.28125) = 0.0375813...) = 0.03759765625, 1
  //     l = 1.03759765625; O~ = P~V = (0.2711181640625, -5.927154541015625)
  //   tile {2}:   m unchanged, alpha = 1; P~ = R(exp(-2.81640625) = 0.0598205...)
  //     = 0.059814453125
  //     l = 1.097412109375; P~V = (-0.179443359375, -0.418701171875)
  //     O~ = (0.0916748046875, -6.345855712890625)
  //   O = R(O~ / l) = R(0.0835372..., -5.7825639...) = (0.08349609375, -5.78125)
  EXPECT_EQ(rules_case_row2(c), V2({0.08349609375, -5.78125}));
  // flash, gpu with accum = bf16 (the paper's BF16 O~ and l): same S, m, P~, P~V; but
  //   tile {0,1}: l = R(1.03759765625) = 1.0390625; O~ = R(P~V) = (0.271484375, -5.9375)
  //   tile {2}:   l = R(1.0390625 + 0.059814453125) = 1.1015625
  //     O~ = R(O~ + R(P~V)) = R(0.271484375 - 0.1794433..., -5.9375 - 0.4187011...)
  //        = (0.091796875, -6.34375)
  //   O = R(0.0833333..., -5.7588652...) = (0.08349609375, -5.75)
  c.accum = DType::BF16;
  EXPECT_EQ(rules_case_row2(c), V2({0.08349609375, -5.75}));
  // flash, every_op (S, m, l, O~ BF16, each op rounded; matmul sums FP32):
  //   tile {0,1}: m = 4.09375; S - m = R(-3.26953125) = -3.265625
  //     P~ = R(exp(-3.265625) = 0.0381730...) = 0.0380859375, 1
  //     rowsum = 1.0380859375 -> l = R(.) = 1.0390625
  //     P~V = (0.267333984375, -5.92620849609375) -> O~ = R(.) = (0.267578125, -5.9375)
  //   tile {2}: alpha = 1; S - m = R(-2.8046875) = -2.8125 (a tie, to even)
  //     P~ = R(exp(-2.8125) = 0.0600546...) = 0.06005859375 (unrounded S - m: 0.060546875)
  //     l = R(1.0390625 + 0.06005859375) = 1.1015625
  //     P~V = (-0.18017578125, -0.42041015625), O~ = R(O~ + R(P~V)) = (0.087890625, -6.34375)
  //   O = R(0.0797872..., -5.7588652...) = (0.07958984375, -5.75)
  c = make_cfg(AttentionKind::Flash, RoundingRule::EveryOp, 2, 2);
  EXPECT_EQ(rules_case_row2(c), V2({0.07958984375, -5.75}));
  // flash, every_op with accum = fp32: every_op's S and P~, but l and O~ kept in FP32:
  //   l = 1.0380859375 + 0.06005859375 = 1.09814453125
  //   O~ = (0.267333984375 - 0.18017578125, -5.92620849609375 - 0.42041015625)
  //      = (0.087158203125, -6.34661865234375)
  //   O = R(0.0793686..., -5.7794019...) = (0.07958984375, -5.78125)
  c.accum = DType::F32;
  EXPECT_EQ(rules_case_row2(c), V2({0.07958984375, -5.78125}));
  // flash, every_mac (every_op, and each multiply-add of q.k, of the row sum and of P~V
  // rounded to BF16):
  //   tile {0,1}: m = 4.125; P~ = R(exp(-3.296875) = 0.0369986...) = 0.037109375, 1
  //     rowsum = R(0.037109375 + 1) = 1.0390625 = l
  //     P~V: R(R(0.037109375 * -7.75 = -0.2875977) + 0.5625) = R(-0.287109375 + 0.5625)
  //          = 0.275390625;  R(R(0.037109375 * 1.9375 = 0.0718994) - 6) =
  //          R(0.07177734375 - 6) = -5.9375;  O~ = (0.275390625, -5.9375)
  //   tile {2}: S - m = R(-2.8359375) = -2.84375 (a tie, to even)
  //     P~ = R(exp(-2.84375) = 0.0582070...) = 0.05810546875
  //     l = R(1.0390625 + 0.05810546875) = 1.09375
  //     P~V = (R(-0.17431640625), R(-0.40673828125)) = (-0.173828125, -0.40625)
  //     O~ = R(0.275390625 - 0.173828125, -5.9375 - 0.40625) = (0.1015625, -6.34375)
  //   O = R(0.0928571..., -5.8) = (0.0927734375, -5.8125)
  c = make_cfg(AttentionKind::Flash, RoundingRule::EveryMac, 2, 2);
  EXPECT_EQ(rules_case_row2(c), V2({0.0927734375, -5.8125}));

  // baseline, gpu (S and P materialised in BF16; exp and row sum FP32; P V accumulated in
  // FP32, O BF16):
  //   S = (0.82421875, 4.09375, 1.2890625), max 4.09375
  //   e = F32(exp(S - max)) = (0.038024246692657471, 1, 0.060525681823492050)
  //   sum = 1.0985498428344727 (FP32)
  //   P = R(e / sum) = (0.03466796875, 0.91015625, 0.05517578125)
  //   P V = (0.0777587890625, -5.779998779296875) -> O = (0.07763671875, -5.78125)
  c = make_cfg(AttentionKind::Baseline, RoundingRule::Gpu);
  EXPECT_EQ(rules_case_row2(c), V2({0.07763671875, -5.78125}));
  // baseline, every_op (S - max, exp and sum in BF16):
  //   e = R(exp(R(S - max))) = (0.0380859375, 1, 0.06005859375); sum = R(1.0981445...) = 1.1015625
  //   P = R(e / sum) = (0.03466796875, 0.90625, 0.054443359375)
  //   P V = (0.0777587890625, -5.751434326171875) -> O = (0.07763671875, -5.75)
  c = make_cfg(AttentionKind::Baseline, RoundingRule::EveryOp);
  EXPECT_EQ(rules_case_row2(c), V2({0.07763671875, -5.75}));
  // baseline, every_mac: S = (0.828125, 4.125, 1.2890625), max 4.125
  //   e = (0.037109375, 1, 0.05810546875); sum = R(R(0.037109375 + 1) + 0.0581...) = 1.09375
  //   P = R(e / sum) = (0.033935546875, 0.9140625, 0.05322265625)
  //   P V with each multiply-add rounded: (0.09033203125, -5.78125) = O
  c = make_cfg(AttentionKind::Baseline, RoundingRule::EveryMac);
  EXPECT_EQ(rules_case_row2(c), V2({0.09033203125, -5.78125}));
}

TEST(AttentionSpec, RescaleHandWorked) {
  // The running-max rescale: d = 1 (scale 1), q = 1, key tiles of 1 and rising scores
  // S = k = (4.5, 6.25, 6.5), v = (-7, 3.625, -1.5); row 2. Every tile raises m, so P~ = 1
  // each time and alpha = exp(m_old - m_new) carries the computation:
  //   exp(-1.75) = 0.17377394...,  exp(-0.25) = 0.77880078...
  // gpu (FP32 alpha, l, O~): alpha = 0.17377394437789917, 0.7788007855415344
  //   l = 1.173774003982544, 1.9141361713409424; O~ = 2.4085824489593506, 0.37580591440200806
  //   O = R(0.19633186) = 0.1962890625 (the exact answer 0.19633184 rounds the same)
  // gpu, accum = bf16: alpha = R(.) = 0.173828125, 0.77734375
  //   tile 1: l = R(1.173828125) = 1.171875; O~ = R(0.173828125 * -7 + 3.625 = 2.408203125)
  //           = 2.40625
  //   tile 2: l = R(0.77734375 * 1.171875 + 1 = 1.9109497) = 1.9140625
  //           O~ = R(0.77734375 * 2.40625 - 1.5 = 0.3704834) = 0.37109375
  //   O = R(0.37109375 / 1.9140625 = 0.1938776) = 0.1943359375
  // every_op: as accum = bf16, and alpha * l, alpha * O~ rounded before the adds:
  //   tile 1: l = R(0.173828125 + 1) = 1.171875; O~ = R(R(-1.216796875) + 3.625)
  //           = R(-1.21875 + 3.625) = 2.40625
  //   tile 2: l = R(R(0.9109497) + 1) = R(0.91015625 + 1) = 1.90625 (a tie, to even)
  //           O~ = R(R(1.8704834) - 1.5) = R(1.8671875 - 1.5) = 0.3671875
  //   O = R(0.3671875 / 1.90625 = 0.1926230) = 0.1923828125
  const Vec q = {1.0, 1.0, 1.0}, k = {4.5, 6.25, 6.5}, v = {-7.0, 3.625, -1.5};
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 1, 1);
  EXPECT_EQ(forward_head(cfg, DType::BF16, 3, 1, q, k, v).o[2], 0.1962890625);
  cfg.accum = DType::BF16;
  EXPECT_EQ(forward_head(cfg, DType::BF16, 3, 1, q, k, v).o[2], 0.1943359375);
  cfg = make_cfg(AttentionKind::Flash, RoundingRule::EveryOp, 1, 1);
  EXPECT_EQ(forward_head(cfg, DType::BF16, 3, 1, q, k, v).o[2], 0.1923828125);
  // All FP32: the FP64 answer to FP32 precision.
  const RefHead ref = reference_head(3, 1, true, q, k, v, {});
  EXPECT_NEAR(forward_head(make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 1, 1), DType::F32, 3,
                           1, q, k, v)
                  .o[2],
              ref.o[2], 1e-7);
}

TEST(AttentionSpec, PaperBitExample) {
  // Qiu & Yao: (-2.40625) + (-0.00087...) + (-2.296875) in BF16. The two large terms are
  // BF16 values of the same binade; their sum -4.703125 lies exactly between the BF16
  // neighbours -4.6875 (even) and -4.71875 (ulp 2^-5 in [4, 8)).
  const double a = -2.40625, b = -0.0008697509765625, c = -2.296875;  // b = -228 * 2^-18
  EXPECT_EQ(a + b + c, -4.7039947509765625);               // exact in double (and in FP32)
  EXPECT_EQ(round_fmt(a + b + c, DType::BF16), -4.71875);  // the small term sets sticky: away
  EXPECT_EQ(round_fmt(a + c, DType::BF16), -4.6875);       // exact tie: to even
  EXPECT_EQ(round_bf16(static_cast<float>(a + b + c)), -4.71875f);
  EXPECT_EQ(round_bf16(static_cast<float>(a + c)), -4.6875f);

  // The same sum as one flash tile's P~V, d = 1 (scale 1), T = 3, row 2 sees keys 0..2:
  //   q = 1.375, k = (0, -5.125, 0): S = (0, -7.046875, 0) -- two tied maxima at 0
  //   P~ = R(exp(0)), R(exp(-7.046875) = 0.00087012...), R(exp(0)) = (1, 228 * 2^-18, 1)
  //   v = (-2.40625, -1, -2.296875): P~V = -2.40625 - 0.0008697509765625 - 2.296875 (FP32,
  //   exact) = -4.7039947509765625; l = 2.0008697509765625
  //   accum = bf16: O~ = R(P~V) = -4.71875, l = R(l) = 2, O = R(-4.71875 / 2) = -2.359375
  //   without the middle term (v1 = 0): O~ = R(-4.703125) = -4.6875, O = -2.34375
  //   accum = fp32: O = R(-4.7039947509765625 / 2.0008697509765625 = -2.35097499...)
  //   = -2.34375, which is also the exact softmax output rounded to BF16.
  const Vec q = {1.375, 1.375, 1.375}, k = {0.0, -5.125, 0.0};
  Vec v = {-2.40625, -1.0, -2.296875};
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, 0);
  cfg.accum = DType::BF16;
  EXPECT_EQ(forward_head(cfg, DType::BF16, 3, 1, q, k, v).o[2], -2.359375);
  v[1] = 0.0;
  EXPECT_EQ(forward_head(cfg, DType::BF16, 3, 1, q, k, v).o[2], -2.34375);
  v[1] = -1.0;
  cfg.accum.reset();  // gpu default: FP32 O~ and l
  const HeadForward fw = forward_head(cfg, DType::BF16, 3, 1, q, k, v);
  EXPECT_EQ(fw.o[2], -2.34375);
  EXPECT_EQ(fw.o32[2],
            static_cast<double>(static_cast<float>(-4.7039947509765625 / 2.0008697509765625)));
  // The FP64 softmax of the same row, rounded once to BF16, is the FP32-accumulator answer.
  const RefHead ref = reference_head(3, 1, true, q, k, v, {});
  EXPECT_EQ(round_fmt(ref.o[2], DType::BF16), -2.34375);
}

TEST(AttentionSpec, NarrowOTildeHandWorked) {
  // attention.o_tilde_bits on the paper's example above: the tile's P~V = -4.70399475...
  // rounds into O~ with N fraction bits (quantum 2^(2 - N) in [4, 8)), l = R(2.00087) = 2.
  //   N = 2: O~ = -5 (nearest of -4, -5), O = R(-5 / 2) = -2.5
  //   N = 3: O~ = -4.5 (of -4.5, -5),      O = -2.25
  //   N = 6: O~ = -4.6875 (of -4.6875, -4.75): here the sticky term no longer decides, O =
  //   -2.34375, the exact answer rounded.
  const Vec q = {1.375, 1.375, 1.375}, k = {0.0, -5.125, 0.0};
  const Vec v = {-2.40625, -1.0, -2.296875};
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, 0);
  cfg.accum = DType::BF16;
  for (const auto& [bits, want] : {std::pair{2, -2.5}, {3, -2.25}, {6, -2.34375}}) {
    cfg.o_tilde_bits = bits;
    EXPECT_EQ(forward_head(cfg, DType::BF16, 3, 1, q, k, v).o[2], want) << bits << " bits";
  }
  // With an FP32 accumulator, 7 bits is BF16's O~ = -4.71875 over the FP32 l = 2.00087:
  // O = R(-2.35835) = -2.359375, the BF16 accumulator's answer of PaperBitExample.
  cfg.accum = DType::F32;
  cfg.o_tilde_bits = 7;
  EXPECT_EQ(forward_head(cfg, DType::BF16, 3, 1, q, k, v).o[2], -2.359375);
  // Refused: baseline (no O~), O~ outside FP32's exponent range, no narrowing.
  AttentionConfig b = make_cfg(AttentionKind::Baseline, RoundingRule::Gpu, 0, 0);
  b.o_tilde_bits = 3;
  EXPECT_THROW(b.numerics(DType::BF16, 0), Error);
  cfg.accum = DType::F16;
  EXPECT_THROW(cfg.numerics(DType::BF16, 0), Error);
  cfg.accum = DType::BF16;
  cfg.o_tilde_bits = 7;
  EXPECT_THROW(cfg.numerics(DType::BF16, 0), Error);
  cfg.o_tilde_bits = 6;
  EXPECT_EQ(cfg.numerics(DType::BF16, 0).o_tilde_bits, 6);
}

namespace {

// The O of the paper's example (NarrowOTildeHandWorked, three causal rows, d 1) under cfg.
Vec paper_example_o(const AttentionConfig& cfg) {
  const Vec q = {1.375, 1.375, 1.375}, k = {0.0, -5.125, 0.0};
  const Vec v = {-2.40625, -1.0, -2.296875};
  return forward_head(cfg, DType::BF16, 3, 1, q, k, v).o;
}

}  // namespace

TEST(AttentionSpec, OTildeScopeHandWorked) {
  // attention.o_tilde_scope on the paper's example: flash, accum bf16, one key tile per row,
  // O~ with 2 fraction bits where narrowed. Row 2's maxima tie (keys 0 and 2, both scores 0);
  // rows 0 and 1 are untied (one key; scores 0 and R(1.375 * -5.125) = -7.0625).
  //   row 0: P~V = v0 = -2.40625: in BF16 -2.40625; 2 bits (quantum 0.5 in [2, 4)): -2.5; l = 1
  //   row 1: P~V = -2.40625 + R(e^-7.0625) * -1 = -2.40711: BF16 -2.40625, 2 bits -2.5;
  //          l = R(1.00086) = 1
  //   row 2: BF16 O~ -4.71875, O = -2.359375; 2 bits O~ -5, O = -2.5 (NarrowOTildeHandWorked)
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, 0);
  cfg.accum = DType::BF16;
  cfg.o_tilde_bits = 2;
  const auto o = [&](OTildeScope scope) {
    cfg.o_tilde_scope = scope;
    return paper_example_o(cfg);
  };
  EXPECT_EQ(o(OTildeScope::All), (Vec{-2.5, -2.5, -2.5}));
  EXPECT_EQ(o(OTildeScope::Tied), (Vec{-2.40625, -2.40625, -2.5}));
  // One tied tile, so one of the two untied ones is narrowed; the tied one is not.
  const Vec m = o(OTildeScope::UntiedMatched);
  EXPECT_EQ(m[2], -2.359375);
  EXPECT_TRUE((m[0] == -2.5 && m[1] == -2.40625) || (m[0] == -2.40625 && m[1] == -2.5))
      << m[0] << " " << m[1];
  // Stabilized flash narrows the same tile (its tie test): row 2's maximum is 0, which the
  // shift leaves alone, so its output is flash's.
  cfg.kind = AttentionKind::StabilizedFlash;
  EXPECT_EQ(o(OTildeScope::Tied), (Vec{-2.40625, -2.40625, -2.5}));
  // Refused: a scope without o_tilde_bits.
  cfg.kind = AttentionKind::Flash;
  cfg.o_tilde_bits = 0;
  cfg.o_tilde_scope = OTildeScope::Tied;
  EXPECT_THROW(cfg.numerics(DType::BF16, 0), Error);
}

TEST(AttentionSpec, OTildeGainHandWorked) {
  // attention.o_tilde_gain on the same example (flash, accum bf16, one tile per row): O~ =
  // u + G (R(u) - u), u the exact update (here P~V, the first tile).
  //   row 2: u = -4.70398331 (FP32), R(u) = -4.71875; G = 32: O~ = -5.17651749, l = 2,
  //          O = R(-2.58825874) = -2.59375; G = 1: O~ = R(u), O = -2.359375 (as without)
  //   row 1: u = -2.40625 - 0.00085831 = -2.40710831, R(u) = -2.40625: O~ = -2.40625 +
  //          31 * 0.00085831 = -2.37964249, l = 1, O = -2.375
  //   row 0: u = v0 is a BF16 value: no error, O = -2.40625
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, 0);
  cfg.accum = DType::BF16;
  cfg.o_tilde_gain = 32;
  EXPECT_EQ(paper_example_o(cfg), (Vec{-2.40625, -2.375, -2.59375}));
  cfg.o_tilde_scope = OTildeScope::Tied;
  EXPECT_EQ(paper_example_o(cfg), (Vec{-2.40625, -2.40625, -2.59375}));
  cfg.o_tilde_gain = 1;
  EXPECT_EQ(paper_example_o(cfg), (Vec{-2.40625, -2.40625, -2.359375}));
  // Refused: with o_tilde_bits, below 1, on baseline.
  cfg.o_tilde_bits = 2;
  EXPECT_THROW(cfg.numerics(DType::BF16, 0), Error);
  cfg.o_tilde_bits = 0;
  cfg.o_tilde_gain = 0.5;
  EXPECT_THROW(cfg.numerics(DType::BF16, 0), Error);
  AttentionConfig b = make_cfg(AttentionKind::Baseline, RoundingRule::Gpu, 0, 0);
  b.o_tilde_gain = 8;
  EXPECT_THROW(b.numerics(DType::BF16, 0), Error);
}

TEST(AttentionSpec, TieBreakHandWorked) {
  // attention.tie_break on the same example (flash, accum bf16, O~ in BF16): row 2's second
  // tied score (key 2) enters exp lowered by eps.
  //   eps = 1e-6: P~ = R(e^-1e-6) = 1, nothing changes: O = -2.359375
  //   eps = 2^-8: P~ = R(0.9961014) = 0.99609375; P~V = -2.40625 - 0.00085831 - 2.28790283
  //   = -4.69501114, O~ = R(.) = -4.6875; l = R(1.99695) = 2; O = -2.34375 (the FP64 softmax
  //   rounded once: breaking the tie removes this row's bias)
  //   eps = 2^-8 with O~ narrowed to 2 bits on tied tiles: O~ = -5, O = -2.5 (the tie test
  //   reads the unperturbed scores)
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, 0);
  cfg.accum = DType::BF16;
  cfg.tie_break = 1e-6;
  EXPECT_EQ(paper_example_o(cfg), (Vec{-2.40625, -2.40625, -2.359375}));
  cfg.tie_break = 0.00390625;
  EXPECT_EQ(paper_example_o(cfg), (Vec{-2.40625, -2.40625, -2.34375}));
  cfg.o_tilde_bits = 2;
  cfg.o_tilde_scope = OTildeScope::Tied;
  EXPECT_EQ(paper_example_o(cfg), (Vec{-2.40625, -2.40625, -2.5}));
  // Refused: stabilized flash and baseline (flash's counterfactual only), negative values.
  for (AttentionKind kind : {AttentionKind::StabilizedFlash, AttentionKind::Baseline}) {
    AttentionConfig b = make_cfg(kind, RoundingRule::Gpu, 0, 0);
    b.tie_break = 0.00390625;
    EXPECT_THROW(b.numerics(DType::BF16, 0), Error) << attention_kind_name(kind);
  }
  cfg.tie_break = -1;
  EXPECT_THROW(cfg.numerics(DType::BF16, 0), Error);
}

TEST(AttentionSpec, OTildeScopeTieTestIsTheSameForFlashAndStabilizedFlash) {
  // Random heads with positive scores (q, k >= 0) and tied keys (k repeated in threes), one
  // key tile per row and 5-wide tiles, O~ with 2 bits on tied tiles. Stabilized flash with
  // beta = 1 shifts nothing where the maximum is positive, so its arithmetic is flash's: the
  // outputs are bit-equal only if both narrow the same tiles. Narrowing on tied tiles must
  // also differ from narrowing everywhere and from not narrowing (the scope acts).
  const int T = 24, d = 8;
  int heads = 0, differ_all = 0, differ_none = 0;
  for (int bc : {0, 5})
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      Rng rng(900 + seed);
      Vec q(T * d), k(T * d), v(T * d);
      for (double& e : q) e = round_fmt(std::fabs(rng.normal()), DType::BF16);
      for (double& e : k) e = round_fmt(std::fabs(rng.normal()), DType::BF16);
      for (double& e : v) e = round_fmt(rng.normal(), DType::BF16);
      for (int s = 0; s < T; ++s)
        for (int j = 0; j < d; ++j) k[s * d + j] = k[(s - s % 3) * d + j];
      AttentionConfig f = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, bc);
      f.accum = DType::BF16;
      f.scores = DType::BF16;
      f.o_tilde_bits = 2;
      f.o_tilde_scope = OTildeScope::Tied;
      AttentionConfig sf = f;
      sf.kind = AttentionKind::StabilizedFlash;
      sf.beta = 1.0;
      const Vec of = forward_head(f, DType::BF16, T, d, q, k, v).o;
      EXPECT_EQ(of, forward_head(sf, DType::BF16, T, d, q, k, v).o) << "seed " << seed;
      AttentionConfig all = f, none = f;
      all.o_tilde_scope = OTildeScope::All;
      none.o_tilde_bits = 0;
      none.o_tilde_scope = OTildeScope::All;
      differ_all += of != forward_head(all, DType::BF16, T, d, q, k, v).o;
      differ_none += of != forward_head(none, DType::BF16, T, d, q, k, v).o;
      ++heads;
    }
  EXPECT_EQ(differ_all, heads);
  EXPECT_EQ(differ_none, heads);
}

TEST(AttentionSpec, OTildeMatchedTilesCountAndChoice) {
  // As many untied tiles as tied ones (all untied ones when fewer), never a tied one; the
  // choice is a fixed function of the maxima, and moves when they move.
  Rng rng(77);
  std::vector<uint8_t> tied(400);
  std::vector<float> mx(400);
  for (size_t i = 0; i < tied.size(); ++i) {
    tied[i] = rng.uniform() < 0.1;
    mx[i] = static_cast<float>(rng.normal());
  }
  const auto count = [](const std::vector<uint8_t>& x) {
    return std::count(x.begin(), x.end(), uint8_t{1});
  };
  const std::vector<uint8_t> a = o_tilde_matched_tiles(tied, mx);
  EXPECT_EQ(count(a), count(tied));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_FALSE(a[i] && tied[i]) << i;
  EXPECT_EQ(a, o_tilde_matched_tiles(tied, mx));
  std::vector<float> mx2 = mx;
  for (float& x : mx2) x += 0.5f;
  const std::vector<uint8_t> b = o_tilde_matched_tiles(tied, mx2);
  EXPECT_EQ(count(b), count(tied));
  EXPECT_NE(a, b);
  // The chosen tiles spread over the call (not the first untied ones): some in each half.
  EXPECT_GT(count(std::vector<uint8_t>(a.begin(), a.begin() + 200)), 0);
  EXPECT_GT(count(std::vector<uint8_t>(a.begin() + 200, a.end())), 0);
  std::vector<uint8_t> most(10, 1);
  most[3] = 0;
  EXPECT_EQ(count(o_tilde_matched_tiles(most, std::vector<float>(10, 1.0f))), 1);
}

TEST(AttentionSpec, NarrowOTildeAmplifiesTheOutputError) {
  // Random heads (T 64, d 32, BF16 inputs, flash, accum bf16, one key tile per row): the
  // error of O against the FP64 reference grows as O~ loses fraction bits. Each bit halves
  // O~'s quantum, so 3 bits against BF16's 7 should give roughly 2^4 times the error; the
  // final rounding of O to BF16 dilutes it, so the test asks for 4x and 1.5x per step.
  const int T = 64, d = 32;
  Rng rng(5);
  Vec q(T * d), k(T * d), v(T * d);
  for (Vec* x : {&q, &k, &v})
    for (double& e : *x) e = round_fmt(2.0 * rng.normal(), DType::BF16);
  const RefHead ref = reference_head(T, d, true, q, k, v, {});
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, 0);
  cfg.accum = DType::BF16;
  auto mean_err = [&](int bits) {
    cfg.o_tilde_bits = bits;
    const HeadForward fw = forward_head(cfg, DType::BF16, T, d, q, k, v);
    double s = 0;
    for (size_t i = 0; i < fw.o.size(); ++i) s += std::fabs(fw.o[i] - ref.o[i]);
    return s / static_cast<double>(fw.o.size());
  };
  const double e7 = mean_err(0), e5 = mean_err(5), e3 = mean_err(3);
  std::printf("  mean |O - O_fp64|: O~ bf16 %.3g, 5 bits %.3g, 3 bits %.3g\n", e7, e5, e3);
  EXPECT_GT(e5, 1.5 * e7);
  EXPECT_GT(e3, 1.5 * e5);
  EXPECT_GT(e3, 4 * e7);
}

TEST(AttentionSpec, StabilizedHandWorked) {
  // The bit example with the tied maxima moved to S = 2.75 > 0 (q = 1.375, k = (2, -3.125,
  // 2)): S = (2.75, -4.296875, 2.75), v as above, gpu rule with a BF16 accumulator, one tile.
  const Vec q = {1.375, 1.375, 1.375}, v = {-2.40625, -1.0, -2.296875};
  Vec k = {2.0, -3.125, 2.0};
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, 0);
  cfg.accum = DType::BF16;
  auto row2 = [&](const AttentionConfig& c) {
    return forward_head(c, DType::BF16, 3, 1, q, k, v).o[2];
  };
  // flash: m = 2.75, P~ = (1, 228 * 2^-18, 1) as before -> O = -2.359375 (biased along v).
  EXPECT_EQ(row2(cfg), -2.359375);
  // stabilized, beta = 2: two entries within tol of r_m = 2.75 > 0, so m' = 2 * 2.75 = 5.5
  //   P~ = R(exp(-2.75) = 0.0639278...) = 0.06396484375, R(exp(-9.796875) = 5.5625e-5)
  //      = 5.555152893066406e-05 (233 * 2^-22), 0.06396484375
  //   rowsum (FP32) = 0.12798523902893066 -> l = R(.) = 0.1279296875
  //   P~V (FP32) = -0.3008902072906494 -> O~ = R(.) = -0.30078125
  //   O = R(-0.30078125 / 0.1279296875 = -2.3511450...) = -2.34375: no bias, P~ < 1 carry
  //   low bits into the sum (the exact answer rounds to -2.34375 too).
  cfg.kind = AttentionKind::StabilizedFlash;
  EXPECT_EQ(row2(cfg), -2.34375);
  // beta = 3: m' = 8.25; P~ = R(exp(-5.5)) = 0.00408935546875 (x2), R(exp(-12.546875))
  //   = 3.56137752532959e-06; l = R(0.00818227...) = 0.0081787109375
  //   O~ = R(-0.0192363...) = -0.019287109375; O = R(-2.3582089...) = -2.359375
  cfg.beta = 3.0;
  EXPECT_EQ(row2(cfg), -2.359375);
  // beta = 3 with max_shift = 2.75: the shift (beta - 1) * 2.75 = 5.5 is capped at 2.75, which
  // is exactly beta = 2's m' = 5.5: the beta = 2 result.
  cfg.max_shift = 2.75;
  EXPECT_EQ(row2(cfg), -2.34375);
  cfg.max_shift = 0.0;
  cfg.beta = 2.0;
  // A negative tied maximum: k = (-2, -7.125, -2), S = (-2.75, -9.796875, -2.75): m' = 0,
  // the same shift of 2.75 and so the same P~, l, O~: O = -2.34375 (flash: -2.359375).
  k = {-2.0, -7.125, -2.0};
  EXPECT_EQ(row2(cfg), -2.34375);
  cfg.kind = AttentionKind::Flash;
  EXPECT_EQ(row2(cfg), -2.359375);
  // A tied maximum at exactly 0 (the bit example's own S = (0, -7.046875, 0)): m' = r_m, no
  // shift, stabilized == flash == -2.359375.
  k = {0.0, -5.125, 0.0};
  cfg.kind = AttentionKind::StabilizedFlash;
  EXPECT_EQ(row2(cfg), -2.359375);
  // The tie tolerance: k2 = 1.9921875 gives S2 = 2.7392578125, 0.0107 below r_m = 2.75.
  //   tol = 1e-3: not tied, m = 2.75, P~ = (1, 228 * 2^-18, R(exp(-0.0107)) = 0.98828125)
  //     l = R(1.9891510...) = 1.9921875, O~ = R(-4.6770782...) = -4.6875,
  //     O = R(-2.3529411...) = -2.359375 (= flash)
  //   tol = 0.02: tied, m' = 5.5, P~ = (0.06396484375, 5.555e-05, R(exp(-2.7607422))
  //     = 0.0634765625); l = R(0.1274969...) = 0.1279296875; O~ = R(-0.2997686...)
  //     = -0.298828125; O = R(-2.3358778...) = -2.328125
  k = {2.0, -3.125, 1.9921875};
  EXPECT_EQ(row2(cfg), -2.359375);
  cfg.kind = AttentionKind::Flash;
  EXPECT_EQ(row2(cfg), -2.359375);
  cfg.kind = AttentionKind::StabilizedFlash;
  cfg.tie_tol = 0.02;
  EXPECT_EQ(row2(cfg), -2.328125);
}

TEST(AttentionSpec, BackwardRulesHandWorked) {
  // d = 1 (scale 1), T = 3 causal, flash tiles 2 x 2 (query tiles {0,1},{2}; key tiles
  // {0,1},{2}), delta from the stored O. q = (-0.9375, -7.5, -1.375), k = (-1.25, -1.5,
  // 1.6875), v = (5, 6.25, 7.75), dO = (-6.25, -2.625, 3.375), so S_ts = q_t k_s.
  // Per rule: P (flash: R_p(exp(S - lse)) recomputed; baseline: the stored P), dP = dO v_s
  // (flash rounds it to accum, baseline to grads), delta, dS = R_g(P (dP - delta)); then
  // dQ = dS K, dK = dS^T Q, dV = P^T dO. Flash adds each (query tile, key tile) partial into
  // an accumulator in `accum` (FP32 for gpu, BF16 for every_op/every_mac); baseline's one
  // GEMM is rounded once. Rows t: P_t. / dS_t. over keys s <= t.
  const Vec q = {-0.9375, -7.5, -1.375}, k = {-1.25, -1.5, 1.6875}, v = {5.0, 6.25, 7.75},
            dO = {-6.25, -2.625, 3.375};
  struct Case {
    AttentionKind kind;
    RoundingRule rule;
    Vec dq, dk, dv;
  };
  const Case cases[] = {
      // flash gpu: lse = (1.171875, 11.392645, 2.606828); O = (5, 6.09375, 5.75)
      //   P  = (1 | 0.1328125, 0.8671875 | 0.412109375, 0.58203125, 0.007232666015625)
      //   dP = (-31.25 | -13.125, -16.40625 | 16.875, 21.09375, 26.15625)  (FP32)
      //   delta = R_fp32(dO O) = (-31.25, -15.99609375, 19.40625)
      //   dS = (0 | 0.380859375, -0.35546875 | -1.046875, 0.98046875, 0.048828125)
      //   dQ_2 = R(-1.046875 * -1.25 + 0.98046875 * -1.5 (key tile 0) + 0.048828125 * 1.6875
      //        (key tile 1)) = R(-0.0797119...) = -0.07958984375
      {AttentionKind::Flash,
       RoundingRule::Gpu,
       {0.0, 0.05712890625, -0.07958984375},
       {-1.4140625, 1.3203125, -0.0673828125},
       {-5.21875, -0.3125, 0.0244140625}},
      // flash every_op: S - lse and P~ in BF16: lse = (1.171875, 11.395182, 2.608632)
      //   P  = (1 | 0.1328125, 0.86328125 | 0.41015625, 0.578125, 0.00738525390625)
      //   dP = (-31.25 | -13.125, -16.375 | 16.875, 21.125, 26.125)  (BF16)
      //   delta = (-31.25, -16, 19.375); dS = (0 | 0.3828125, -0.32421875 | -1.0234375,
      //   1.015625, 0.0498046875); partials and accumulators BF16
      {AttentionKind::Flash,
       RoundingRule::EveryOp,
       {0.0, 0.0078125, -0.16015625},
       {-1.46875, 1.0390625, -0.068359375},
       {-5.21875, -0.314453125, 0.02490234375}},
      // flash every_mac: the forward's BF16 P~V sum gives O_1 = 6.0625, delta_1 = -15.9375,
      //   dS_1 = (0.373046875, -0.376953125); the rest as every_op
      {AttentionKind::Flash,
       RoundingRule::EveryMac,
       {0.0, 0.0986328125, -0.158203125},
       {-1.390625, 1.4296875, -0.068359375},
       {-5.21875, -0.3125, 0.02490234375}},
      // baseline gpu: P = (1 | 0.1328125, 0.8671875 | 0.412109375, 0.58203125, 0.00732421875)
      //   dP = R_bf16(dO v) = (-31.25 | -13.125, -16.375 | 16.875, 21.125, 26.125)
      //   delta = R_fp32(sum P dP) = (-31.25, -15.943359375, 19.44110107421875)
      //   dS = (0 | 0.375, -0.375 | -1.0546875, 0.98046875, 0.049072265625)
      //   dQ = R(dS K) once: (0, R(0.09375), R(-0.0695343...)) = (0, 0.09375, -0.0693359375)
      {AttentionKind::Baseline,
       RoundingRule::Gpu,
       {0.0, 0.09375, -0.0693359375},
       {-1.359375, 1.4609375, -0.0673828125},
       {-5.21875, -0.3125, 0.024658203125}},
      // baseline every_op: P = (1 | 0.1328125, 0.86328125 | 0.412109375, 0.578125,
      //   0.007293701171875); delta = R_bf16(sum P dP) = (-31.25, -15.875, 19.375)
      //   dS = (0 | 0.365234375, -0.431640625 | -1.03125, 1.015625, 0.04931640625)
      {AttentionKind::Baseline,
       RoundingRule::EveryOp,
       {0.0, 0.19140625, -0.1513671875},
       {-1.3203125, 1.84375, -0.06787109375},
       {-5.21875, -0.314453125, 0.024658203125}},
      // baseline every_mac: the same dS, each multiply-add of the GEMMs rounded: dV_0 =
      //   R(R(-6.25 + 0.1328125 * -2.625) + 0.412109375 * 3.375) = R(-6.59375 + 1.3908691...)
      //   = R(-5.2028809) = -5.1875 (every_op, one rounding of -5.2077637: -5.21875)
      {AttentionKind::Baseline,
       RoundingRule::EveryMac,
       {0.0, 0.1904296875, -0.1513671875},
       {-1.3125, 1.8359375, -0.06787109375},
       {-5.1875, -0.314453125, 0.024658203125}},
  };
  for (const Case& c : cases) {
    const AttentionConfig cfg = make_cfg(c.kind, c.rule, 2, 2);
    const HeadRun r = run_head(cfg, cfg.numerics(DType::BF16, 0), 3, 1, q, k, v, dO);
    EXPECT_EQ(r.dq, c.dq) << attention_kind_name(c.kind) << " " << rounding_rule_name(c.rule);
    EXPECT_EQ(r.dk, c.dk) << attention_kind_name(c.kind) << " " << rounding_rule_name(c.rule);
    EXPECT_EQ(r.dv, c.dv) << attention_kind_name(c.kind) << " " << rounding_rule_name(c.rule);
  }
}

// ---------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------
// 4. Attention statistics through the Attention class, on constructed scores.

namespace {

// qkv (B, T, 3C) with head size 4 (scale 0.5 exactly): q_t = (1, 0, 0, 0) and
// k_s = (2 x_s, 0, 0, 0), so head h of batch b has S_ts = x[b][h][s] exactly.
template <class S>
Tensor stats_qkv(const std::vector<std::vector<Vec>>& x, int T, int NH, DType dt, Rng& rng) {
  const int B = static_cast<int>(x.size()), hs = 4, C = NH * hs;
  Tensor qkv = Tensor::empty({B, T, 3 * C}, dt);
  S* p = qkv.data<S>();
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < hs; ++i) {
          S* row = p + (static_cast<size_t>(b) * T + t) * 3 * C + h * hs + i;
          row[0] = static_cast<S>(i == 0 ? 1.0 : 0.0);
          row[C] = static_cast<S>(i == 0 ? 2 * x[b][h][t] : 0.0);
          row[2 * C] = static_cast<S>(round_fmt(rng.normal(), DType::BF16));
        }
  return qkv;
}

}  // namespace

TEST(AttentionStats, ConstructedCountsThroughAttentionClass) {
  // B = 3, T = 6, NH = 2, key tiles of 3 ({0,1,2}, {3,4,5}); tie_tol 1e-3, beta 2.
  // Row t sees x[0..t]. Per (batch, head), row by row (t = 0..5):
  //  b0 h0 x = (1, 3, 3, 0, 3, 2): ties from t = 2 (keys 1, 2 in tile 0): tied 4, in tile 4.
  //     flash P~ == 1: t0 key0; t1 key1; t2 keys 1,2; t3 keys 1,2 (tile 1 max 0 < m);
  //     t4, t5 keys 1,2 and key 4 (tile 1 max 3 = m) -> 1+1+2+2+3+3 = 12.
  //     stabilized: a tied tile 0 moves m to 6, so only t0, t1 have P~ == 1 -> 2.
  //  b0 h1 x = (0.5, -1, 2, 1.25, -3, 4): no ties. P~ == 1: one per row, plus key 5 at t5
  //     (tile 1's max 4 becomes m) -> 7 for flash and stabilized.
  //  b1 h0 x = (2, 2 + 2^-11, -1, 2 + 2^-9, 0, 0): t1, t2 tied within tol in tile 0
  //     (2^-11 < 1e-3); from t3 the maximum 2 + 2^-9 is 1.46e-3 clear: not tied. tied 2,
  //     in tile 2. flash P~ == 1: 1, 1, 1, then 2 (key 1 and key 3) for t3..t5 -> 9.
  //     stabilized: t0 only (tile 0 tied from t1: m = 2 (2 + 2^-11) > every score) -> 1.
  //  b1 h1 x = (-1, -1, -3, -2, -5, -4): tied at -1 in tile 0 from t1: tied 5, in tile 5.
  //     flash P~ == 1: 1 + 2 * 5 = 11; stabilized (negative tie: m' = 0): t0 only -> 1.
  //  b2 h0 x = (1, 3, 0, 3, -1, 0): keys 1 and 3 tie across the tile boundary from t3:
  //     tied 3, in tile 0. flash = stabilized (no tile has two maxima): 1, 1, 1, 2, 2, 2 -> 9.
  //  b2 h1 x = 0: every row from t1 tied in tile 0: tied 5, in tile 5. r_m = 0 means no
  //     shift: every entry has P~ = 1 for both -> 1 + 2 + ... + 6 = 21.
  // Baseline: its one "tile" is the whole row, so every tied row is tied in tile; P~ == 1
  // (exp(S - row max)) at each row's maxima: b0 h0 1,1,2,2,3,3 = 12; b1 h0 one per row
  // (2^-11 and 2^-9 apart: exp(-2^-11) < 1 in FP32) = 6; b2 h0 1,1,1,2,2,2 = 9; b0 h1 6;
  // b1 h1 1 + 2 * 5 = 11; b2 h1 21.
  // p_one (normalised P == 1) only where a row has one key (t0 of each batch; every other
  // row has a second key within 4 of its maximum, P <= 1 / (1 + e^-4) < 1 in FP32) -> 3 per
  // head, the same for every backend.
  // Totals, head 0: tied 4+2+3 = 9, in tile 4+2+0 = 6, P~==1 flash 30, stabilized 12,
  //                 baseline 12+6+9 = 27.
  //         head 1: tied 0+5+5 = 10, in tile 10, P~==1 flash 7+11+21 = 39, stabilized 29,
  //                 baseline 6+11+21 = 38.
  const std::vector<std::vector<Vec>> x = {
      {{1, 3, 3, 0, 3, 2}, {0.5, -1, 2, 1.25, -3, 4}},
      {{2, 2 + 0x1p-11, -1, 2 + 0x1p-9, 0, 0}, {-1, -1, -3, -2, -5, -4}},
      {{1, 3, 0, 3, -1, 0}, {0, 0, 0, 0, 0, 0}}};
  const int B = 3, T = 6, NH = 2, C = 8;
  struct Want {
    int64_t tied, in_tile, p_one, p_tilde_one;
  };
  auto be = make_cpu_backend();
  for (DType dt : {DType::F64, DType::F32})
    for (AttentionKind kind : kKinds) {
      Rng rng(5);
      const Tensor qkv = dt == DType::F64 ? stats_qkv<double>(x, T, NH, dt, rng)
                                          : stats_qkv<float>(x, T, NH, dt, rng);
      AttentionConfig cfg = make_cfg(kind, RoundingRule::Gpu, 3, 3);
      cfg.collect_stats = true;
      auto attn = be->make_attention(cfg);
      Tensor out = Tensor::empty({B, T, C}, dt), lse = Tensor::empty({B, NH, T}, dt);
      attn->forward(out, lse, qkv, NH, dt);  // compute format = storage format: FP64 / FP32
      const auto& st = attn->stats();
      ASSERT_EQ(st.size(), 2u);
      const Want want[3][2] = {{{9, 9, 3, 27}, {10, 10, 3, 38}},     // baseline
                               {{9, 6, 3, 30}, {10, 10, 3, 39}},     // flash
                               {{9, 6, 3, 12}, {10, 10, 3, 29}}};    // stabilized flash
      for (int h = 0; h < NH; ++h) {
        const Want& w = want[static_cast<int>(kind)][h];
        SCOPED_TRACE(std::string(attention_kind_name(kind)) + " " + dtype_name(dt) + " head " +
                     std::to_string(h));
        EXPECT_EQ(st[h].rows, B * T);
        EXPECT_EQ(st[h].max_logit, h == 0 ? 3.0 : 4.0);
        EXPECT_EQ(st[h].tied_rows, w.tied);
        EXPECT_EQ(st[h].tied_in_tile, w.in_tile);
        EXPECT_EQ(st[h].p_one, w.p_one);
        EXPECT_EQ(st[h].p_tilde_one, w.p_tilde_one);
        // Entropy directly: H = -sum p log p of the exact softmax of each row's x[0..t].
        double H = 0;
        for (int b = 0; b < B; ++b)
          for (int t = 0; t < T; ++t) {
            double mx = -1e300, Z = 0;
            for (int s = 0; s <= t; ++s) mx = std::max(mx, x[b][h][s]);
            for (int s = 0; s <= t; ++s) Z += std::exp(x[b][h][s] - mx);
            for (int s = 0; s <= t; ++s) {
              const double p = std::exp(x[b][h][s] - mx) / Z;
              H -= p * std::log(p);
            }
          }
        EXPECT_NEAR(st[h].mean_entropy(), H / (B * T), 1e-12);
        if (h == 1 && kind == AttentionKind::Baseline && dt == DType::F64)
          std::printf(
              "  head 1: mean entropy %.15f (direct %.15f); b2's uniform rows give "
              "ln 1 .. ln 6\n",
              st[h].mean_entropy(), H / (B * T));
      }
    }
  // Off unless asked for.
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 3, 3);
  auto attn = be->make_attention(cfg);
  Rng rng(5);
  const Tensor qkv = stats_qkv<float>(x, T, NH, DType::F32, rng);
  Tensor out = Tensor::empty({B, T, C}, DType::F32), lse = Tensor::empty({B, NH, T}, DType::F32);
  attn->forward(out, lse, qkv, NH, DType::BF16);
  EXPECT_TRUE(attn->stats().empty());
}

namespace {

// One head, T = 6, d = 4, scale 1/2: key s is 2 (x_s, y_s, z_s, w_s), query row t is e_t for
// t < 4 and 0 for t = 4, 5, so row 0 scores x, row 1 y, row 2 z, row 3 w and rows 4, 5 are
// all 0. Every value is exact in BF16 and FP16. V is a fixed pattern (not used by the counts).
struct OnesCase {
  Vec q, k, v;
  static constexpr int T = 6, d = 4;
};
OnesCase ones_case() {
  const double x[6] = {0, 12, 1, -2, 0.5, 3};       // dominant key 1, next 9 below
  const double y[6] = {1, 5, -1, 5, 2, 0};          // two tied maxima (keys 1, 3)
  const double z[6] = {0.5, 1, 0.25, 0.75, 1.5, 0.5};  // diffuse, unique maximum
  const double w[6] = {1, 2, 0, 3, 1, 14};          // dominant key 5 (the last tile), 11 clear
  OnesCase c;
  c.q.assign(6 * 4, 0.0);
  c.k.assign(6 * 4, 0.0);
  c.v.assign(6 * 4, 0.0);
  for (int t = 0; t < 4; ++t) c.q[t * 4 + t] = 1.0;
  for (int s = 0; s < 6; ++s) {
    c.k[s * 4 + 0] = 2 * x[s];
    c.k[s * 4 + 1] = 2 * y[s];
    c.k[s * 4 + 2] = 2 * z[s];
    c.k[s * 4 + 3] = 2 * w[s];
    for (int j = 0; j < 4; ++j) c.v[s * 4 + j] = 0.25 * ((s + j) % 5) - 0.5;
  }
  return c;
}

AttentionHeadStats head_stats(const AttentionConfig& cfg, DType f, int T, int d, const Vec& q,
                              const Vec& k, const Vec& v) {
  HeadForward fw;
  head_forward(cfg, cfg.numerics(f, 0), T, d, q.data(), k.data(), v.data(), fw, true);
  return fw.stats;
}

}  // namespace

TEST(AttentionStats, POneIsTheNormalisedPForEveryBackend) {
  // p_one counts the normalised P == 1, one definition for every backend (issue 21, finding
  // 6). From the inputs (ones_case, non-causal): P of a row's maximum is 1 / (1 + sum_s
  // e^{S_s - max}); it rounds to 1 in BF16 when >= 1 - 2^-9 (FP16: 1 - 2^-12):
  //   row 0 (x): sum = e^-9 + e^-11 + e^-11.5 + e^-12 + e^-14 = 1.57e-4 -> P = 1 - 1.57e-4: 1
  //   row 3 (w): sum = e^-11 + 2 e^-13 + e^-12 + e^-14 = 2.9e-5 -> 1
  //   row 1 (y): two maxima, P <= 1/2; row 2 (z): P <= 1 / (1 + e^-0.5); rows 4, 5: 1/6
  // so p_one = 2 in BF16 and FP16, for baseline (its P), flash and stabilized flash (P from
  // lse as the backward recomputes it), whatever the key tiles; stabilized flash's shift of
  // the tied tile (row 1 with tiles of 4: keys 1, 3 in tile 0) changes P~, not P. The old
  // flash count (P~ per tile) was 2 + ... per row instead: p_tilde_one, checked larger here.
  const OnesCase c = ones_case();
  // The count straight from the exact softmax of the scores, rounded to BF16 / FP16.
  const double S[6][6] = {{0, 12, 1, -2, 0.5, 3},   {1, 5, -1, 5, 2, 0},
                          {0.5, 1, 0.25, 0.75, 1.5, 0.5}, {1, 2, 0, 3, 1, 14},
                          {0, 0, 0, 0, 0, 0},        {0, 0, 0, 0, 0, 0}};
  for (DType f : {DType::BF16, DType::F16}) {
    int direct = 0;
    for (const auto& row : S) {
      double mx = -1e300, Z = 0;
      for (double s : row) mx = std::max(mx, s);
      for (double s : row) Z += std::exp(s - mx);
      for (double s : row) direct += round_fmt(std::exp(s - mx) / Z, f) == 1.0;
    }
    ASSERT_EQ(direct, 2) << dtype_name(f);
    for (AttentionKind kind : kKinds)
      for (int bc : {0, 2, 3, 4}) {
        AttentionConfig cfg = make_cfg(kind, RoundingRule::Gpu, bc, bc);
        cfg.causal = false;
        const AttentionHeadStats st = head_stats(cfg, f, c.T, c.d, c.q, c.k, c.v);
        SCOPED_TRACE(std::string(attention_kind_name(kind)) + " " + dtype_name(f) + " tiles " +
                     std::to_string(bc));
        EXPECT_EQ(st.rows, 6);
        EXPECT_EQ(st.p_one, 2);
        // P~ == 1 at least at every row's maximum (rows 0, 2, 3: one; rows 4, 5: six each;
        // row 1: two, unless stabilized flash shifts its tied tile).
        if (kind != AttentionKind::StabilizedFlash) {
          EXPECT_GE(st.p_tilde_one, 1 + 2 + 1 + 1 + 12);
        }
      }
  }
}

TEST(AttentionStats, PTildeOneIsFlashWithOneKeyTile) {
  // p_tilde_one counts the unnormalised exponentials equal to 1: flash per key tile against
  // the running max; baseline exp(S - row max), which is flash with one key tile per row
  // (block_k = 0): the same count on any input. Smaller tiles only add ones (each tile that
  // raises the running max has P~ = 1 at its maximum).
  // Hand-built, causal, T = 6, one head, BF16: row t scores x[0..t], x = (1, 2, 3, 4, 5, 6)
  // rising (q = e0, k_s = 2 x_s e0, scale 1/2). One tile: P~ == 1 only at each row's
  // maximum -> 6. Tiles of 2: every tile raises the running max -> tiles per row
  // 1, 1, 2, 2, 3, 3 -> 12. (The old e^-1 = 0.37 is not 1 in BF16.)
  {
    const int T = 6, d = 4;
    Vec q(T * d, 0.0), k(T * d, 0.0), v(T * d, 0.0);
    for (int t = 0; t < T; ++t) {
      q[t * d] = 1.0;
      k[t * d] = 2.0 * (t + 1);
      v[t * d + 1] = 0.5 * t;
    }
    const auto base = head_stats(make_cfg(AttentionKind::Baseline, RoundingRule::Gpu), DType::BF16,
                                 T, d, q, k, v);
    const auto one = head_stats(make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 0, 0),
                                DType::BF16, T, d, q, k, v);
    const auto small = head_stats(make_cfg(AttentionKind::Flash, RoundingRule::Gpu, 2, 2),
                                  DType::BF16, T, d, q, k, v);
    EXPECT_EQ(base.p_tilde_one, 6);
    EXPECT_EQ(one.p_tilde_one, 6);
    EXPECT_EQ(small.p_tilde_one, 12);
    // Normalised P: row 0 only (one key); row t >= 1 has P(max) <= 1 / (1 + e^-1).
    EXPECT_EQ(base.p_one, 1);
    EXPECT_EQ(one.p_one, 1);
    EXPECT_EQ(small.p_one, 1);
  }
  // Random causal inputs (T = 48, d = 8, BF16 / FP16 / FP32, query scaled so that some rows
  // are dominated by one key): baseline == flash with one tile for p_tilde_one (and p_one),
  // flash with tiles of 4 strictly more. attention.scores is the compute format for both
  // (the gpu rule's flash default is FP32 scores, baseline's the compute format), so both
  // exponentiate the same S.
  for (DType f : {DType::BF16, DType::F16, DType::F32}) {
    const int T = 48, d = 8;
    Rng rng(21);
    Vec q(T * d), k(T * d), v(T * d);
    for (double& a : q) a = round_fmt(3.0 * rng.normal(), DType::BF16);
    for (double& a : k) a = round_fmt(rng.normal(), DType::BF16);
    for (double& a : v) a = round_fmt(rng.normal(), DType::BF16);
    auto cfg = [&](AttentionKind kind, int bc) {
      AttentionConfig c = make_cfg(kind, RoundingRule::Gpu, bc, bc);
      c.scores = f;
      return c;
    };
    const auto base = head_stats(cfg(AttentionKind::Baseline, 0), f, T, d, q, k, v);
    const auto one = head_stats(cfg(AttentionKind::Flash, 0), f, T, d, q, k, v);
    const auto small = head_stats(cfg(AttentionKind::Flash, 4), f, T, d, q, k, v);
    SCOPED_TRACE(dtype_name(f));
    std::printf("  %s: p_tilde_one baseline %lld, flash one tile %lld, tiles of 4 %lld; p_one "
                "%lld / %lld / %lld\n",
                dtype_name(f), (long long)base.p_tilde_one, (long long)one.p_tilde_one,
                (long long)small.p_tilde_one, (long long)base.p_one, (long long)one.p_one,
                (long long)small.p_one);
    EXPECT_GE(base.p_tilde_one, T);  // at least each row's maximum
    EXPECT_EQ(one.p_tilde_one, base.p_tilde_one);
    EXPECT_GT(small.p_tilde_one, base.p_tilde_one);
    EXPECT_EQ(one.p_one, base.p_one);
    EXPECT_EQ(small.p_one, base.p_one);
  }
}

// ---------------------------------------------------------------------------------------
// 5. The Attention class: packing, FP32 O for listed heads, delta modes.

namespace {

struct Packed {
  int B, T, NH, hs, C;
  Tensor qkv, dout;
};

Packed make_packed(int B, int T, int NH, int hs, uint64_t seed) {
  Packed p{B, T, NH, hs, NH * hs, {}, {}};
  Rng rng(seed);
  p.qkv = Tensor::empty({B, T, 3 * p.C}, DType::F32);
  p.dout = Tensor::empty({B, T, p.C}, DType::F32);
  float* a = p.qkv.data<float>();
  for (int64_t i = 0; i < p.qkv.numel(); ++i)  // q columns (first C of each row) scaled by 2
    a[i] = round_bf16(static_cast<float>(((i % (3 * p.C)) < p.C ? 2.0 : 1.0) * rng.normal()));
  for (int64_t i = 0; i < p.dout.numel(); ++i)
    p.dout.data<float>()[i] = round_bf16(static_cast<float>(rng.normal()));
  return p;
}

// Column block `which` (0 q, 1 k, 2 v) of head h, batch b, from a (B, T, 3C) tensor, or
// head h of a (B, T, C) tensor when which < 0.
Vec head_of(const Packed& p, const Tensor& t, int b, int h, int which) {
  Vec r(static_cast<size_t>(p.T) * p.hs);
  const int64_t row = t.dim(2);
  const int64_t col0 = (which < 0 ? 0 : which * p.C) + h * p.hs;
  for (int s = 0; s < p.T; ++s)
    for (int i = 0; i < p.hs; ++i)
      r[s * p.hs + i] = t.data<float>()[(static_cast<int64_t>(b) * p.T + s) * row + col0 + i];
  return r;
}

}  // namespace

TEST(AttentionClass, PackingMatchesHeadFunctions) {
  // The class gathers each (batch, head) from (B, T, 3C) and scatters back: every output
  // must be exactly what head_forward / head_backward give for that head (outputs poisoned
  // with NaN first so an unwritten element fails).
  const Packed p = make_packed(2, 37, 3, 32, 21);
  auto be = make_cpu_backend();
  for (AttentionKind kind : kKinds) {
    const AttentionConfig cfg = make_cfg(kind, RoundingRule::Gpu, 16, 8);
    auto attn = be->make_attention(cfg);
    Tensor out = Tensor::empty({p.B, p.T, p.C}, DType::F32),
           lse = Tensor::empty({p.B, p.NH, p.T}, DType::F32),
           dqkv = Tensor::empty({p.B, p.T, 3 * p.C}, DType::F32);
    for (Tensor* t : {&out, &lse, &dqkv})
      std::fill(t->data<float>(), t->data<float>() + t->numel(), std::nanf(""));
    attn->forward(out, lse, p.qkv, p.NH, DType::BF16);
    attn->backward(dqkv, p.dout, p.qkv, out, lse, p.NH, DType::BF16);
    for (int b = 0; b < p.B; ++b)
      for (int h = 0; h < p.NH; ++h) {
        const Vec q = head_of(p, p.qkv, b, h, 0), k = head_of(p, p.qkv, b, h, 1),
                  v = head_of(p, p.qkv, b, h, 2), dO = head_of(p, p.dout, b, h, -1);
        const HeadRun r = run_head(cfg, cfg.numerics(DType::BF16, h), p.T, p.hs, q, k, v, dO);
        EXPECT_EQ(head_of(p, out, b, h, -1), r.fw.o) << attention_kind_name(kind);
        for (int t = 0; t < p.T; ++t)
          EXPECT_EQ(lse.data<float>()[(b * p.NH + h) * p.T + t], static_cast<float>(r.fw.lse[t]));
        EXPECT_EQ(head_of(p, dqkv, b, h, 0), r.dq) << attention_kind_name(kind);
        EXPECT_EQ(head_of(p, dqkv, b, h, 1), r.dk) << attention_kind_name(kind);
        EXPECT_EQ(head_of(p, dqkv, b, h, 2), r.dv) << attention_kind_name(kind);
      }
  }
}

TEST(AttentionClass, Fp32OutHeads) {
  // fp32_out_heads = {1} of 3, compute format BF16: head 1's stored O is the FP32 O (o32 of
  // the same head's default forward), the other heads are bit-identical to the default run.
  // Flash's backward forms delta from the stored O, so only head 1's gradients move;
  // baseline's never uses O (delta = rowsum(dP * P)), so none of its gradients move.
  const Packed p = make_packed(2, 41, 3, 32, 31);
  auto be = make_cpu_backend();
  for (AttentionKind kind : {AttentionKind::Baseline, AttentionKind::Flash}) {
    AttentionConfig c0 = make_cfg(kind, RoundingRule::Gpu, 16, 16), c1 = c0;
    c1.fp32_out_heads = {1};
    EXPECT_EQ(c1.numerics(DType::BF16, 1).out, DType::F32);
    EXPECT_EQ(c1.numerics(DType::BF16, 0).out, DType::BF16);
    Tensor out[2], lse[2], dqkv[2];
    for (int i = 0; i < 2; ++i) {
      auto attn = be->make_attention(i ? c1 : c0);
      out[i] = Tensor::empty({p.B, p.T, p.C}, DType::F32);
      lse[i] = Tensor::empty({p.B, p.NH, p.T}, DType::F32);
      dqkv[i] = Tensor::empty({p.B, p.T, 3 * p.C}, DType::F32);
      attn->forward(out[i], lse[i], p.qkv, p.NH, DType::BF16);
      attn->backward(dqkv[i], p.dout, p.qkv, out[i], lse[i], p.NH, DType::BF16);
    }
    int64_t off_bf16 = 0, n1 = 0;
    for (int b = 0; b < p.B; ++b)
      for (int h = 0; h < p.NH; ++h) {
        const Vec o0 = head_of(p, out[0], b, h, -1), o1 = head_of(p, out[1], b, h, -1);
        for (double x : o0) ASSERT_EQ(x, round_fmt(x, DType::BF16)) << "default O is BF16";
        if (h != 1) {
          EXPECT_EQ(o1, o0) << "head " << h << " must not change";
          for (int w = 0; w < 3; ++w)
            EXPECT_EQ(head_of(p, dqkv[1], b, h, w), head_of(p, dqkv[0], b, h, w));
          continue;
        }
        HeadForward fw;
        head_forward(c0, c0.numerics(DType::BF16, 1), p.T, p.hs, head_of(p, p.qkv, b, 1, 0).data(),
                     head_of(p, p.qkv, b, 1, 1).data(), head_of(p, p.qkv, b, 1, 2).data(), fw);
        EXPECT_EQ(o1, fw.o32) << "head 1 stores the FP32 O";
        EXPECT_EQ(o0, fw.o);
        for (double x : o1) {
          off_bf16 += x != round_fmt(x, DType::BF16);
          ++n1;
        }
        const bool grads_moved = head_of(p, dqkv[1], b, 1, 0) != head_of(p, dqkv[0], b, 1, 0);
        EXPECT_EQ(grads_moved, kind == AttentionKind::Flash) << attention_kind_name(kind);
      }
    for (int64_t i = 0; i < lse[0].numel(); ++i)
      ASSERT_EQ(lse[0].data<float>()[i], lse[1].data<float>()[i]);
    EXPECT_GT(off_bf16, n1 * 9 / 10) << "head 1's O should be FP32 values, not BF16";
  }
}

TEST(AttentionClass, DeltaModes) {
  // delta_t as head_deltas forms it under each mode (flash, BF16 gpu rule), against the
  // exact delta of the same BF16 inputs. Errors normalised per row by sum_j |dO_j O_j|.
  //   o, o_fp32: rowsum of dO * (stored BF16 O | FP32 O), accumulated in FP32 -> equal to the
  //     exact sum over that O to FP32 accumulation error (d + 1 roundings of 2^-24);
  //   o_split: hi = R(O32) is O32 to 2^-8 relative, lo = R(O32 - hi) the residual to 2^-8 of
  //     itself, so hi + lo is O32 to 2^-16 and delta(o_split) = delta(o_fp32) to 2^-16 (plus
  //     FP32 accumulation);
  //   fp32_recompute: O from an all-FP32 forward -> the exact delta to FP32 precision;
  //   dp_p: rowsum(dP * P) with P recomputed in BF16 from lse -> BF16-level error.
  // In FP64 settings every mode is the same number in exact arithmetic: 1e-12.
  const int T = kT, d = 64;
  const auto heads = make_heads(1, T, d, DType::BF16, 77);
  const auto& h = heads[0];
  const DeltaMode modes[] = {DeltaMode::O, DeltaMode::OSplit, DeltaMode::OFp32, DeltaMode::DpP,
                             DeltaMode::Fp32Recompute};
  AttentionConfig cfg = make_cfg(AttentionKind::Flash, RoundingRule::Gpu);
  const AttnNumerics n0 = cfg.numerics(DType::BF16, 0);
  HeadForward fw;
  head_forward(cfg, n0, T, d, h.q.data(), h.k.data(), h.v.data(), fw);
  auto delta = [&](DeltaMode m, const AttnNumerics& base, const HeadForward& f) {
    AttnNumerics n = base;
    n.delta = m;
    return head_deltas(cfg, n, T, d, h.q.data(), h.k.data(), h.v.data(), f, h.dout.data());
  };
  Vec norm(T, 0.0);  // sum_j |dO_j O_j| with the exact O
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < d; ++j) norm[t] += std::fabs(h.dout[t * d + j] * h.ref.o[t * d + j]);
  auto rel = [&](const Vec& a, const Vec& b) {
    double m = 0;
    for (int t = 0; t < T; ++t) m = std::max(m, std::fabs(a[t] - b[t]) / norm[t]);
    return m;
  };
  auto rowsum = [&](const Vec& O) {
    Vec r(T, 0.0);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < d; ++j) r[t] += h.dout[t * d + j] * O[t * d + j];
    return r;
  };
  Vec dl[5];
  for (int i = 0; i < 5; ++i) dl[i] = delta(modes[i], n0, fw);
  std::printf("  BF16 gpu flash, max_t |delta - exact| / sum_j |dO O|:\n");
  for (int i = 0; i < 5; ++i)
    std::printf("    %-15s %.2e\n", delta_mode_name(modes[i]), rel(dl[i], h.ref.delta));
  std::printf("    o_split vs o_fp32 %.2e, o vs o_fp32 %.2e\n", rel(dl[1], dl[2]),
              rel(dl[0], dl[2]));
  const double acc_tol = (d + 1) * 0x1p-24 * 2;  // FP32 accumulation, with room
  EXPECT_LT(rel(dl[0], rowsum(fw.o)), acc_tol);
  EXPECT_LT(rel(dl[2], rowsum(fw.o32)), acc_tol);
  EXPECT_LT(rel(dl[1], dl[2]), 0x1p-16 + 2 * acc_tol);
  EXPECT_GT(rel(dl[0], dl[2]), 0x1p-14) << "stored-O delta should carry BF16-level error";
  EXPECT_LT(rel(dl[4], h.ref.delta), 1e-5);
  EXPECT_GT(rel(dl[3], h.ref.delta), 1e-4) << "dp_p uses BF16 P";
  EXPECT_LT(rel(dl[3], h.ref.delta), 0x1p-6);
  // The split O itself, from o32 as the spec says.
  for (int i = 0; i < T * d; i += 97) {
    const double hi = round_fmt(fw.o32[i], DType::BF16);
    EXPECT_LE(std::fabs(hi + round_fmt(fw.o32[i] - hi, DType::BF16) - fw.o32[i]),
              0x1p-16 * std::fabs(fw.o32[i]));
  }
  // The mode reaches the gradients: dQ differs between o and o_fp32.
  {
    AttentionConfig c2 = cfg;
    c2.delta = DeltaMode::OFp32;
    Vec dq1(T * d), dq2(T * d), dk(T * d), dv(T * d);
    head_backward(cfg, cfg.numerics(DType::BF16, 0), T, d, h.q.data(), h.k.data(), h.v.data(), fw,
                  h.dout.data(), dq1.data(), dk.data(), dv.data());
    head_backward(c2, c2.numerics(DType::BF16, 0), T, d, h.q.data(), h.k.data(), h.v.data(), fw,
                  h.dout.data(), dq2.data(), dk.data(), dv.data());
    EXPECT_NE(dq1, dq2);
  }
  // Baseline never uses O.
  EXPECT_EQ(make_cfg(AttentionKind::Baseline, RoundingRule::Gpu).numerics(DType::BF16, 0).delta,
            DeltaMode::DpP);
  // FP64 settings: all modes agree with the exact delta (and so with each other).
  const AttnNumerics n64 = cfg.numerics(DType::F64, 0);
  HeadForward fw64;
  head_forward(cfg, n64, T, d, h.q.data(), h.k.data(), h.v.data(), fw64);
  for (DeltaMode m : modes) {
    const double e = rel(delta(m, n64, fw64), h.ref.delta);
    EXPECT_LT(e, 1e-12) << delta_mode_name(m);
  }
}

// cudnn is NVIDIA's kernel: the CPU backend refuses it with one line naming the key and
// the way out, and a backend name round-trips.
TEST(AttentionKinds, CudnnIsRefusedOnTheCpu) {
  EXPECT_EQ(parse_attention_kind("cudnn"), AttentionKind::Cudnn);
  EXPECT_STREQ(attention_kind_name(AttentionKind::Cudnn), "cudnn");
  AttentionConfig cfg;
  cfg.kind = AttentionKind::Cudnn;
  auto be = make_cpu_backend();
  std::string msg;
  try {
    be->make_attention(cfg);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("attention.backend = cudnn runs only on an NVIDIA GPU (device: cuda)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}
