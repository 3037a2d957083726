// The O~ amplifier cases (attention.o_tilde_bits, o_tilde_gain, o_tilde_scope all | tied)
// shared by the SIMT emulator's test of the CUDA kernels (tests/simt/test_simt_flash_amp.cpp,
// label emu) and the GPU's (tests/test_gpu_flash.cpp, GpuFlash.AmplifierMatchesTheLab, label
// gpu): the inputs, the cases, the CPU lab's results and the checks that each case tests
// something. Host C++ only.
//
// Bit for bit. The kernels round at the lab's points; what differs below them is the MMA's
// summation order and the FP32 row sum (exact sums make them vanish) and exp as ex2 of an
// FP32 product (absorbed by P~'s and alpha's rounding to the compute format unless the exact
// value lies within the approximation's error of a rounding boundary). exact_inputs() builds
// inputs on which all of that is exact or absorbed:
//   - scores S = a_t * x_s exactly: q = a_t (e0 + e1), a_t in {1, 1/2}; k[0] + k[1] = x_s / scale
//     as a hi/lo pair of the compute format; x_s a multiple of 1/8 in [0, 7/8]. With hs 64 the
//     scale is 1/8 and S is exact in FP32; with hs 128 the scores are rounded to the compute
//     format (attention.scores), which lands on a_t x_s (the pair carries 16+ bits).
//   - every S - m and m - m_new is then a multiple of 1/16 in [-1.75, 0] (stabilized flash's
//     m' = 2 r_m included); exp of each lies more than 2^-18 (relative) from a rounding
//     boundary of the compute format, checked below (check_exp_margins), so the
//     emulator's exp2f and a GPU's ex2.approx (~2^-22) round as FP64 exp does;
//   - V in multiples of 1/2 in [-3/2, 3/2]: P~ >= e^-1.75 has at most 11 bits above 2^-3, so
//     every P~V partial and the row sum are exact in FP32 in any order.
// Per key tile (of block_k keys) the largest x (5/8, 6/8 or 7/8) is at one key (untied) or
// two (tied), so tiles of both kinds occur, and rows whose maximum is unique or tied; causal
// rows see prefixes of the diagonal tile, which mixes them further. On these inputs O, lse
// and the FP32 O (delta o_fp32's saved o32) must equal the lab's bits for every amplifier
// setting with accum = the compute format (the paper's BF16 O~ accumulator, and the 124M
// study's setting). With accum fp32, alpha stays the FP32 result
// of exp and so differs from the lab's by FP32 ulps: those cases run random inputs and are
// judged in ulps of O, as tests/simt/test_simt_flash.cpp's parity cases.
// Each case also checks, on the lab, that the amplifier changed O (it acts) and, for scope
// tied, that O differs from scope all's (the scope acts), so no case passes by doing nothing.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "attention/head_cpu.h"
#include "attention_test_util.h"
#include "core/attention.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace st::amp_test {

// 1 / sqrt(hs) rounded once to FP32, the kernels' scale (cuda/flash_plan.cu's scale_of).
inline double scale_of(int hs) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs))); }

using attn_test::Dims;
using attn_test::ulp_at;

// (B, T, 3C) values of the compute format in FP32 storage.
inline std::vector<float> exact_inputs(const Dims& d, DType fmt, int block_k, uint64_t seed) {
  const int C = d.C();
  std::vector<float> qkv(static_cast<size_t>(d.B) * d.T * 3 * C, 0.0f);
  Rng rng(seed);
  const double scale = scale_of(d.hs);
  auto at = [&](int b, int t, int part, int h, int j) -> float& {
    return qkv[(static_cast<size_t>(b) * d.T + t) * 3 * C + part * C + h * d.hs + j];
  };
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h) {
      std::vector<int> x(d.T);  // x_s in eighths
      for (int t0 = 0; t0 < d.T; t0 += block_k) {
        const int t1 = std::min(t0 + block_k, d.T);
        const int top = 5 + static_cast<int>(rng.below(3));  // the tile's largest: 5/8 .. 7/8
        for (int s = t0; s < t1; ++s) x[s] = static_cast<int>(rng.below(top));
        const int tops = rng.uniform() < 0.5 ? 1 : 2;
        for (int i = 0; i < tops; ++i) x[t0 + static_cast<int>(rng.below(t1 - t0))] = top;
      }
      for (int t = 0; t < d.T; ++t) {
        const float a = rng.uniform() < 0.5 ? 1.0f : 0.5f;
        at(b, t, 0, h, 0) = at(b, t, 0, h, 1) = a;
        const double X = x[t] / 8.0 / scale;
        const double hi = round_fmt(X, fmt);
        at(b, t, 1, h, 0) = static_cast<float>(hi);
        at(b, t, 1, h, 1) = static_cast<float>(round_fmt(X - hi, fmt));
        for (int j = 0; j < d.hs; ++j)
          at(b, t, 2, h, j) = static_cast<float>(static_cast<int>(rng.below(7)) - 3) / 2.0f;
      }
    }
  return qkv;
}

// q, k ~ N(0, 1) (q scaled by 2: peakier rows), v ~ N(0.7, 0.3), rounded to fmt; keys 2 and 5
// of every head equal (tied maxima in many rows): attn_test::random_inputs with V shifted and
// without dout (tests/attention_test_util.h).
inline std::vector<float> random_inputs(const Dims& d, DType fmt, uint64_t seed) {
  std::vector<float> qkv(d.n_qkv());
  Rng rng(seed);
  attn_test::draw_qkv(qkv, d, fmt, rng, 2.0, 0.7, 0.3);
  attn_test::tie_keys(qkv, d, fmt, rng);
  return qkv;
}

struct Case {
  const char* name;
  DType fmt;
  int hs, bq, bk;
  bool stab, causal;
  int T, B, NH;
  int bits;       // attention.o_tilde_bits
  double gain;    // attention.o_tilde_gain
  bool tied;      // attention.o_tilde_scope: tied (else all)
  bool acc_low;   // attention.accum: the compute format (else fp32)
  bool exact;     // exact_inputs and bit-for-bit; else random_inputs within ulps
  uint64_t seed;
};
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

inline AttentionConfig config_of(const Case& c, bool amplified = true) {
  AttentionConfig cfg;
  cfg.kind = c.stab ? AttentionKind::StabilizedFlash : AttentionKind::Flash;
  cfg.causal = c.causal;
  cfg.block_q = c.bq;
  cfg.block_k = c.bk;
  cfg.delta = DeltaMode::OFp32;  // the forward saves its FP32 O too: compared as well
  if (c.acc_low) cfg.accum = c.fmt;
  if (c.hs == 128 && c.exact) cfg.scores = c.fmt;  // see exact_inputs
  if (amplified) {
    cfg.o_tilde_bits = c.bits;
    cfg.o_tilde_gain = c.gain;
    cfg.o_tilde_scope = c.tied ? OTildeScope::Tied : OTildeScope::All;
  }
  return cfg;
}

// The lab per head: O (B, T, C), its FP32 O and lse (B, NH, T), and the tied-tile count.
struct Lab {
  std::vector<double> o, o32, lse;
};
inline Lab run_lab(const AttentionConfig& cfg, const Dims& d, DType fmt, const std::vector<float>& qkv) {
  const AttnNumerics n = cfg.numerics(fmt, 0);
  const int C = d.C();
  Lab lab;
  lab.o.assign(static_cast<size_t>(d.B) * d.T * C, 0.0);
  lab.o32 = lab.o;
  lab.lse.assign(static_cast<size_t>(d.B) * d.NH * d.T, 0.0);
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h) {
      const size_t td = static_cast<size_t>(d.T) * d.hs;
      std::vector<double> q(td), k(td), v(td);
      for (int t = 0; t < d.T; ++t)
        for (int j = 0; j < d.hs; ++j) {
          const size_t r = (static_cast<size_t>(b) * d.T + t) * 3 * C + h * d.hs + j;
          q[t * d.hs + j] = qkv[r];
          k[t * d.hs + j] = qkv[r + C];
          v[t * d.hs + j] = qkv[r + 2 * C];
        }
      HeadForward fw;
      fw.o.resize(td);
      fw.o32.resize(td);
      fw.lse.resize(d.T);
      head_forward(cfg, n, d.T, d.hs, q.data(), k.data(), v.data(), fw);
      for (int t = 0; t < d.T; ++t) {
        lab.lse[(static_cast<size_t>(b) * d.NH + h) * d.T + t] = fw.lse[t];
        for (int j = 0; j < d.hs; ++j) {
          const size_t r = (static_cast<size_t>(b) * d.T + t) * C + h * d.hs + j;
          lab.o[r] = fw.o[t * d.hs + j];
          lab.o32[r] = fw.o32[t * d.hs + j];
        }
      }
    }
  return lab;
}

// (row, key tile) pairs whose tile is tied (more than one score within tie_tol of its
// maximum: o_tilde_scope tied's test) and untied, from the scores as the lab forms them (the
// q.k sum in FP64 then FP32: exact for exact_inputs, and for the tied keys of random_inputs).
inline std::pair<int64_t, int64_t> tile_kinds(const AttentionConfig& cfg, const Dims& d, DType fmt,
                                       const std::vector<float>& qkv) {
  const AttnNumerics n = cfg.numerics(fmt, 0);
  const double scale = scale_of(d.hs);
  const int C = d.C();
  int64_t tied = 0, untied = 0;
  std::vector<double> S(d.T);
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h)
      for (int t = 0; t < d.T; ++t) {
        const int last = cfg.causal ? t : d.T - 1;
        const float* q = &qkv[(static_cast<size_t>(b) * d.T + t) * 3 * C + h * d.hs];
        for (int s = 0; s <= last; ++s) {
          const float* k = &qkv[(static_cast<size_t>(b) * d.T + s) * 3 * C + C + h * d.hs];
          double dot = 0;
          for (int j = 0; j < d.hs; ++j) dot += static_cast<double>(q[j]) * k[j];
          S[s] = round_fmt(round_fmt(dot, DType::F32) * scale, n.scores);
        }
        for (int c0 = 0; c0 <= last; c0 += cfg.block_k) {
          const int w = std::min(cfg.block_k, last + 1 - c0);
          const double rm = *std::max_element(S.begin() + c0, S.begin() + c0 + w);
          (tile_ties(S.data() + c0, w, rm, cfg.tie_tol) > 1 ? tied : untied) += 1;
        }
      }
  return {tied, untied};
}

inline size_t count_differing(const std::vector<double>& a, const std::vector<double>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// Bit-for-bit (exact inputs) or within `ulps` of fmt at the largest |reference|; printed.
inline void compare(const char* who, const Case& c, const char* what, const std::vector<double>& got,
                    const std::vector<double>& want, DType unit, double ulps) {
  ASSERT_EQ(got.size(), want.size());
  size_t same = 0, worst = 0;
  double max_abs = 0, max_ref = 0;
  bool finite = true;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i];
    finite = finite && std::isfinite(g);
    same += g == want[i];
    const double e = std::fabs(g - want[i]);
    if (e > max_abs) max_abs = e, worst = i;
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  const double tol = ulps * ulp_at(max_ref, unit);
  std::printf("%s %s %-4s identical=%zu/%zu max_abs=%.3e (%.2f ulp of %s at %.3e)\n",
              who, c.name, what, same, want.size(), max_abs,
              max_ref > 0 ? max_abs / ulp_at(max_ref, unit) : 0.0, dtype_name(unit), max_ref);
  EXPECT_TRUE(finite) << c.name << " " << what << ": an element is not finite (unwritten?)";
  if (c.exact)
    EXPECT_EQ(same, want.size()) << c.name << " " << what << ": first differing element near "
                                 << worst << " (" << got[worst] << " vs " << want[worst] << ")";
  else
    EXPECT_LE(max_abs, tol) << c.name << " " << what << ": worst element " << worst;
}

// Shapes: both head sizes, all three forward tiles, causal and not, T not a multiple of the
// tiles, B and NH > 1; settings: bits 2 and 3 (all, tied), gain 8 and 64 (all, tied), bf16
// and fp16 (fp16 O~ takes the gain only: o_tilde_bits narrows within FP32's exponent range).
// With accum fp32 the gain on tied tiles alone would test nothing on these inputs (their ties
// are in the first tile, whose FP32 update r = P~V is exact): that case takes scope all.
inline const std::vector<Case> kCases = {
    {"bf16_hs64_q64k64_flash_causal_bits2_all", DType::BF16, 64, 64, 64, false, true, 150, 1, 2,
     2, 0, false, true, true, 61},
    {"bf16_hs64_q128k64_stab_noncausal_gain64_tied", DType::BF16, 64, 128, 64, true, false, 130,
     2, 1, 0, 64, true, true, true, 62},
    {"bf16_hs128_q128k128_flash_causal_gain64_tied", DType::BF16, 128, 128, 128, false, true, 200,
     1, 1, 0, 64, true, true, true, 63},
    {"bf16_hs64_q128k128_stab_causal_bits3_tied", DType::BF16, 64, 128, 128, true, true, 257, 1,
     1, 3, 0, true, true, true, 64},
    {"f16_hs64_q64k64_stab_causal_gain8_all", DType::F16, 64, 64, 64, true, true, 100, 1, 2, 0, 8,
     false, true, true, 65},
    {"f16_hs128_q128k64_flash_noncausal_gain64_tied", DType::F16, 128, 128, 64, false, false, 100,
     1, 2, 0, 64, true, true, true, 66},
    {"bf16_hs64_q64k64_flash_causal_acc32_bits12_tied", DType::BF16, 64, 64, 64, false, true, 77,
     1, 1, 12, 0, true, false, false, 67},
    {"f16_hs64_q128k64_stab_causal_acc32_gain8_all", DType::F16, 64, 128, 64, true, true, 77, 1,
     1, 0, 8, false, false, false, 68},
};

// What a case needs to test something, on the lab (printed with `who`): key tiles of both
// kinds, O changed by the amplifier, and (scope tied) O different from scope all's.
inline void check_premises(const char* who, const Case& c, const std::vector<float>& qkv, const Lab& lab) {
  const Dims d{c.B, c.T, c.NH, c.hs};
  const AttentionConfig cfg = config_of(c);
  const auto [tied, untied] = tile_kinds(cfg, d, c.fmt, qkv);
  std::printf("%s %s (row, key tile) pairs: %lld tied, %lld untied\n", who, c.name,
              static_cast<long long>(tied), static_cast<long long>(untied));
  ASSERT_GT(tied, 0) << "the inputs should tie the maxima of some key tiles";
  ASSERT_GT(untied, 0) << "the inputs should leave some key tiles untied";

  // The amplifier acts (O differs from the unamplified lab's), and so does the scope.
  const Lab plain = run_lab(config_of(c, false), d, c.fmt, qkv);
  const size_t acted = count_differing(lab.o32, plain.o32);
  std::printf("%s %s FP32 O changed by the amplifier: %zu of %zu\n", who, c.name, acted,
              lab.o32.size());
  EXPECT_GT(acted, 0u) << "the amplifier left the lab's O unchanged: the case tests nothing";
  if (c.tied) {
    Case all = c;
    all.tied = false;
    const size_t scoped = count_differing(lab.o32, run_lab(config_of(all), d, c.fmt, qkv).o32);
    std::printf("%s %s FP32 O differing between scope tied and all: %zu\n", who, c.name,
                scoped);
    EXPECT_GT(scoped, 0u) << "scope tied gave scope all's O: the scope is not tested";
  }
}

// The premise of the exact inputs: exp of every S - m and m - m_new they can produce (the
// multiples of 1/16 in [-1.75, 0)) lies more than 2^-18 (relative) from a rounding boundary
// (a midpoint between neighbours) of bf16 and fp16, so an exp with a smaller error (the
// emulator's exp2f of x log2(e) in FP32, a GPU's ex2.approx) rounds to the same value.
inline void check_exp_margins() {
  for (DType fmt : {DType::BF16, DType::F16}) {
    const int mant = fmt == DType::BF16 ? 7 : 10;
    double worst = 1;
    for (int i = 1; i <= 28; ++i) {
      const double v = std::exp(-i / 16.0);
      const double ulp = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(v))) - mant);
      const double frac = v / ulp - std::floor(v / ulp);
      const double margin = std::fabs(frac - 0.5) * ulp / v;
      worst = std::min(worst, margin);
      EXPECT_GT(margin, 0x1p-18) << dtype_name(fmt) << " exp(" << -i / 16.0 << ")";
      const float emu = std::exp2(static_cast<float>(-i / 16.0) * 1.4426950408889634f);
      EXPECT_EQ(round_fmt(emu, fmt), round_fmt(v, fmt)) << dtype_name(fmt) << " exp(" << -i / 16.0 << ")";
    }
    std::printf("amp inputs %s smallest exp margin %.3e (2^%.1f)\n", dtype_name(fmt),
                worst, std::log2(worst));
  }
}

}  // namespace st::amp_test
