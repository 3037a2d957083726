// Attention numerics, part 2 of test_attention (one executable; the opening comment of
// test_attention.cpp lists the parts): hand-worked cases for each rounding rule of
// attention/head_cpu.cpp, forward and backward, the O~ amplifier's settings and the Qiu & Yao
// bit example, every intermediate value written out in the comments and asserted ==.
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

// 2. Hand-worked spec cases: each rounding point of head_cpu.cpp's header comment, worked
// step by step for inputs small enough to follow (values checked with exact rational
// arithmetic; "R" is RNE to BF16, every listed value is exact). Asserted with ==.

namespace {

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
