// The attention fast path (attention/head_fast.h) against the numerics lab it stands in for
// (attention/head_cpu.cpp, the reference): the same bits, forward (O, the FP32 O, lse,
// baseline's P) and backward (dQ, dK, dV), on every backend, every format the model
// computes in (FP32, BF16, FP16), causal and not, every tile shape the lab distinguishes,
// each single-point override the fast path accepts, each delta mode it accepts, and
// stabilized flash on rows with tied maxima. Then the layer (make_attention_cpu) with and
// without the fast path, and the settings the fast path must refuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention_cpu.h"
#include "attention/head_cpu.h"
#include "attention/head_fast.h"
#include "core/attention_numerics.h"
#include "core/rng.h"

using namespace st;

namespace {

// Bitwise equality of a float result with the lab's value (a double holding a value of the
// format); NaN != NaN here on purpose: neither path may produce one on these inputs.
int mismatches(const float* fast, const std::vector<double>& lab, size_t n, std::string& first,
               const char* what) {
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(lab[i]);
    if (static_cast<double>(want) != lab[i] ||
        std::memcmp(&want, fast + i, sizeof(float)) != 0 || !std::isfinite(fast[i])) {
      if (bad++ == 0) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s[%zu]: fast %.9g lab %.17g", what, i, fast[i], lab[i]);
        first = buf;
      }
    }
  }
  return bad;
}

struct Inputs {
  std::vector<double> q, k, v, dout;  // already rounded to the formats they are read in
};

// q ~ N(0, scale_q^2), k, v, dout ~ N(0, 1). With ties, key s copies key s - (s % 3) for
// every third key, so q.k_s ties exactly with q.k_(s-1) and q.k_(s-2): exact tied scores in
// most rows, inside one key tile or across two, for the stabilized backend.
Inputs make_inputs(int T, int d, const AttnNumerics& n, double scale_q, bool ties, uint64_t seed) {
  Rng rng(seed);
  Inputs in;
  const size_t td = static_cast<size_t>(T) * d;
  in.q.resize(td), in.k.resize(td), in.v.resize(td), in.dout.resize(td);
  for (size_t i = 0; i < td; ++i) {
    in.q[i] = round_fmt(scale_q * rng.normal(), n.qkv);
    in.k[i] = round_fmt(rng.normal(), n.qkv);
    in.v[i] = round_fmt(rng.normal(), n.qkv);
    in.dout[i] = round_fmt(rng.normal(), n.grads);
  }
  if (ties)
    for (int s = 0; s < T; ++s)
      for (int j = 0; j < d; ++j) in.k[static_cast<size_t>(s) * d + j] = in.k[static_cast<size_t>(s - s % 3) * d + j];
  return in;
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// Runs one head both ways; returns the number of mismatching values and the first one.
int compare_head(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                 const Inputs& in, std::string& first) {
  HeadForward fw;
  head_forward(cfg, n, T, d, in.q.data(), in.k.data(), in.v.data(), fw);
  const size_t td = static_cast<size_t>(T) * d;
  std::vector<double> dq(td), dk(td), dv(td);
  head_backward(cfg, n, T, d, in.q.data(), in.k.data(), in.v.data(), fw, in.dout.data(),
                dq.data(), dk.data(), dv.data());

  const auto q = to_float(in.q), k = to_float(in.k), v = to_float(in.v), dO = to_float(in.dout);
  std::vector<float> o(td), o32(td), lse(T), P(static_cast<size_t>(T) * T), fq(td), fk(td), fv(td);
  HeadFastSaved sv;
  sv.o = o.data();
  sv.o32 = o32.data();
  sv.lse = lse.data();
  sv.P = cfg.kind == AttentionKind::Baseline ? P.data() : nullptr;
  head_fast_forward(cfg, n, T, d, q.data(), k.data(), v.data(), sv);
  head_fast_backward(cfg, n, T, d, q.data(), k.data(), v.data(), sv, dO.data(), fq.data(),
                     fk.data(), fv.data());
  int bad = mismatches(o.data(), fw.o, td, first, "O");
  bad += mismatches(o32.data(), fw.o32, td, first, "O32");
  bad += mismatches(lse.data(), fw.lse, T, first, "lse");
  if (sv.P) bad += mismatches(P.data(), fw.P, P.size(), first, "P");
  bad += mismatches(fq.data(), dq, td, first, "dQ");
  bad += mismatches(fk.data(), dk, td, first, "dK");
  bad += mismatches(fv.data(), dv, td, first, "dV");
  return bad;
}

const AttentionKind kKinds[] = {AttentionKind::Baseline, AttentionKind::Flash,
                                AttentionKind::StabilizedFlash};
const DType kFormats[] = {DType::F32, DType::BF16, DType::F16};

struct Override {
  const char* name;
  void (*apply)(AttentionConfig&);
};
// Single-point overrides the fast path accepts (the rule's defaults first; accum bf16 is the
// paper's implementation, whose l follows accum).
const Override kOverrides[] = {
    {"rule defaults", [](AttentionConfig&) {}},
    {"accum bf16", [](AttentionConfig& c) { c.accum = DType::BF16; }},
    {"lsum bf16", [](AttentionConfig& c) { c.lsum = DType::BF16; }},
    {"scores bf16", [](AttentionConfig& c) { c.scores = DType::BF16; }},
    {"probs fp32", [](AttentionConfig& c) { c.probs = DType::F32; }},
    {"out fp32, grads fp32", [](AttentionConfig& c) { c.out = c.grads = DType::F32; }},
    {"qkv fp16", [](AttentionConfig& c) { c.qkv = DType::F16; }},
};

struct Tiles {
  int br, bc;
};
// The model's default (64 x 64), one tile per row, tiles that divide nothing (5 x 7), more
// query rows than key columns and the reverse.
const Tiles kTiles[] = {{64, 64}, {0, 0}, {5, 7}, {16, 8}, {8, 16}};

}  // namespace

TEST(AttentionFast, BitEqualToTheLabOnEverySetting) {
  int cases = 0, eligible = 0;
  for (AttentionKind kind : kKinds)
    for (DType f : kFormats)
      for (const Override& ov : kOverrides)
        for (const Tiles& tl : kTiles)
          for (bool causal : {true, false}) {
            if (kind == AttentionKind::Baseline && (tl.br != 64 || tl.bc != 64)) continue;
            AttentionConfig cfg;
            cfg.kind = kind;
            cfg.causal = causal;
            cfg.block_q = tl.br;
            cfg.block_k = tl.bc;
            ov.apply(cfg);
            const AttnNumerics n = cfg.numerics(f, 0);
            ASSERT_TRUE(head_fast_eligible(cfg, n)) << n.describe();
            ++eligible;
            const bool ties = kind == AttentionKind::StabilizedFlash;
            // T = 37 and d = 16: no tile divides T; one larger head at the model's shape.
            for (const auto& [T, d, sq] : {std::tuple{37, 16, 2.0}, std::tuple{64, 64, 4.0}}) {
              const Inputs in = make_inputs(T, d, n, sq, ties, 1000 + cases);
              std::string first;
              const int bad = compare_head(cfg, n, T, d, in, first);
              ++cases;
              EXPECT_EQ(bad, 0) << attention_kind_name(kind) << " " << dtype_name(f) << " "
                                << ov.name << " tiles " << tl.br << "x" << tl.bc
                                << (causal ? " causal" : " non-causal") << " T=" << T
                                << " d=" << d << ": " << first;
            }
          }
  std::printf("fast path vs lab: %d heads compared over %d settings, every value bit-equal "
              "unless reported above\n", cases, eligible);
  EXPECT_GT(cases, 300);
}

TEST(AttentionFast, DeltaModesAndStabilizedSettings) {
  // Flash backends with each delta the fast path accepts; stabilized flash with large beta
  // (shift at the cap), negative tied maxima, and tie tolerances that widen the ties.
  int cases = 0;
  for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
    for (DType f : kFormats)
      for (DeltaMode dm : {DeltaMode::O, DeltaMode::OFp32, DeltaMode::OSplit})
        for (int variant = 0; variant < 3; ++variant) {
          AttentionConfig cfg;
          cfg.kind = kind;
          cfg.delta = dm;
          cfg.block_q = 16;
          cfg.block_k = 8;
          cfg.beta = variant == 1 ? 7.0 : 2.0;
          cfg.tie_tol = variant == 2 ? 0.05 : 1e-3;
          const AttnNumerics n = cfg.numerics(f, 0);
          ASSERT_TRUE(head_fast_eligible(cfg, n));
          // variant 1: scores near +20 (large shifts); variant 2: q negated so the tied
          // maxima are often negative.
          Inputs in = make_inputs(37, 16, n, variant == 1 ? 6.0 : 2.0, true, 77 + cases);
          if (variant == 2)
            for (double& x : in.q) x = -x;
          std::string first;
          EXPECT_EQ(compare_head(cfg, n, 37, 16, in, first), 0)
              << attention_kind_name(kind) << " " << dtype_name(f) << " delta "
              << delta_mode_name(dm) << " variant " << variant << ": " << first;
          ++cases;
        }
  std::printf("delta modes and stabilized settings: %d heads bit-equal\n", cases);
}

TEST(AttentionFast, NarrowOTildeBitEqualToTheLab) {
  // attention.o_tilde_bits (O~ with fewer fraction bits): flash and stabilized flash, O~ in
  // BF16 (the paper's accum) or FP32, tiles one per row, ragged and the default, with tied
  // maxima, causal and not.
  int cases = 0;
  for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
    for (DType f : kFormats)
      for (bool bf16_accum : {true, false})
        for (int bits : {1, 3, 6, 12})
          for (const Tiles& tl : {Tiles{0, 0}, Tiles{5, 7}, Tiles{64, 64}})
            for (bool causal : {true, false}) {
              if (bf16_accum && bits > 6) continue;
              AttentionConfig cfg;
              cfg.kind = kind;
              cfg.causal = causal;
              cfg.block_q = tl.br;
              cfg.block_k = tl.bc;
              cfg.accum = bf16_accum ? DType::BF16 : DType::F32;
              cfg.o_tilde_bits = bits;
              const AttnNumerics n = cfg.numerics(f, 0);
              ASSERT_TRUE(head_fast_eligible(cfg, n)) << n.describe();
              const Inputs in = make_inputs(37, 16, n, 2.0, true, 5000 + cases);
              std::string first;
              EXPECT_EQ(compare_head(cfg, n, 37, 16, in, first), 0)
                  << attention_kind_name(kind) << " " << dtype_name(f) << " " << n.describe()
                  << " tiles " << tl.br << "x" << tl.bc << ": " << first;
              ++cases;
            }
  std::printf("narrow O~: %d heads bit-equal\n", cases);
  EXPECT_EQ(cases, 2 * 3 * (3 + 4) * 3 * 2);
}

TEST(AttentionFast, OTildeScopeAndTieBreakBitEqualToTheLab) {
  // attention.o_tilde_scope (tied, untied_matched), attention.o_tilde_gain and
  // attention.tie_break: flash and stabilized flash (tie_break: flash only), O~ in BF16 with
  // 2 bits or the gain 32 where amplified, tiles one per row, ragged and the default, tied
  // keys, causal and not.
  int cases = 0;
  for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
    for (DType f : kFormats)
      for (OTildeScope scope : {OTildeScope::All, OTildeScope::Tied, OTildeScope::UntiedMatched})
        for (double brk : {0.0, 0.00390625})
          for (double gain : {0.0, 32.0})
          for (const Tiles& tl : {Tiles{0, 0}, Tiles{5, 7}, Tiles{64, 64}})
            for (bool causal : {true, false}) {
              if (brk > 0 && kind != AttentionKind::Flash) continue;
              AttentionConfig cfg;
              cfg.kind = kind;
              cfg.causal = causal;
              cfg.block_q = tl.br;
              cfg.block_k = tl.bc;
              cfg.accum = DType::BF16;
              cfg.o_tilde_bits = gain > 0 ? 0 : 2;
              cfg.o_tilde_gain = gain;
              cfg.o_tilde_scope = scope;
              cfg.tie_break = brk;
              const AttnNumerics n = cfg.numerics(f, 0);
              ASSERT_TRUE(head_fast_eligible(cfg, n)) << n.describe();
              const Inputs in = make_inputs(37, 16, n, 2.0, true, 7000 + cases);
              std::string first;
              EXPECT_EQ(compare_head(cfg, n, 37, 16, in, first), 0)
                  << attention_kind_name(kind) << " " << dtype_name(f) << " " << n.describe()
                  << " tiles " << tl.br << "x" << tl.bc << ": " << first;
              ++cases;
            }
  std::printf("O~ scope, gain and tie break: %d heads bit-equal\n", cases);
  EXPECT_EQ(cases, 3 * 3 * 6 * 2 * (2 + 1));
}

TEST(AttentionFast, RefusesWhatItDoesNotReproduce) {
  AttentionConfig cfg;
  cfg.kind = AttentionKind::Flash;
  EXPECT_TRUE(head_fast_eligible(cfg, cfg.numerics(DType::BF16, 0)));
  EXPECT_FALSE(head_fast_eligible(cfg, cfg.numerics(DType::F64, 0)));  // the FP64 reference mode
  AttentionConfig r = cfg;
  r.rule = RoundingRule::EveryOp;
  EXPECT_FALSE(head_fast_eligible(r, r.numerics(DType::BF16, 0)));
  r.rule = RoundingRule::EveryMac;
  EXPECT_FALSE(head_fast_eligible(r, r.numerics(DType::BF16, 0)));
  AttentionConfig m = cfg;
  m.mac = DType::BF16;
  EXPECT_FALSE(head_fast_eligible(m, m.numerics(DType::BF16, 0)));
  AttentionConfig lm = cfg;
  lm.lsum_mac = DType::BF16;
  EXPECT_FALSE(head_fast_eligible(lm, lm.numerics(DType::BF16, 0)));
  for (DeltaMode dm : {DeltaMode::DpP, DeltaMode::Fp32Recompute}) {
    AttentionConfig dc = cfg;
    dc.delta = dm;
    EXPECT_FALSE(head_fast_eligible(dc, dc.numerics(DType::BF16, 0))) << delta_mode_name(dm);
    dc.kind = AttentionKind::Baseline;  // baseline never forms delta from O
    EXPECT_TRUE(head_fast_eligible(dc, dc.numerics(DType::BF16, 0))) << delta_mode_name(dm);
  }
  AttentionConfig es = cfg;
  es.kind = AttentionKind::StabilizedFlash;
  es.tie_shift = TieShift::ExactSum;
  EXPECT_FALSE(head_fast_eligible(es, es.numerics(DType::BF16, 0)));
}

namespace {

// Packed (B, T, 3C) activations and (B, T, C) output gradients, BF16-valued.
void fill(Tensor& t, Rng& rng, int C, double q_scale) {
  float* a = t.data<float>();
  const int64_t row = t.dim(2);
  for (int64_t i = 0; i < t.numel(); ++i)
    a[i] = round_bf16(static_cast<float>(((i % row) < C ? q_scale : 1.0) * rng.normal()));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data<float>(), b.data<float>(), a.numel() * sizeof(float)) == 0;
}

}  // namespace

TEST(AttentionFast, LayerGivesTheLabsBits) {
  // The layer as the model calls it, fast path against the lab forced, on every backend and
  // compute format, with a per-head FP32 output (fp32_out_heads) and the paper's accum.
  const int B = 2, T = 45, NH = 3, hs = 16, C = NH * hs;
  Rng rng(5);
  Tensor qkv = Tensor::empty({B, T, 3 * C}, DType::F32), dout = Tensor::empty({B, T, C}, DType::F32);
  fill(qkv, rng, C, 3.0);
  fill(dout, rng, C, 1.0);
  int layers = 0;
  for (AttentionKind kind : kKinds)
    for (DType f : kFormats)
      for (int variant = 0; variant < 3; ++variant) {
        AttentionConfig cfg;
        cfg.kind = kind;
        cfg.block_q = 16;
        cfg.block_k = 32;
        if (variant == 1) cfg.fp32_out_heads = {1};
        if (variant == 2) cfg.accum = DType::BF16;
        Tensor out[2], lse[2], dqkv[2];
        for (int path = 0; path < 2; ++path) {
          auto attn = make_attention_cpu(cfg, path == 0 ? AttentionCpuPath::Auto : AttentionCpuPath::Lab);
          out[path] = Tensor::empty({B, T, C}, DType::F32);
          lse[path] = Tensor::empty({B, NH, T}, DType::F32);
          dqkv[path] = Tensor::empty({B, T, 3 * C}, DType::F32);
          attn->forward(out[path], lse[path], qkv, NH, f);
          attn->backward(dqkv[path], dout, qkv, out[path], lse[path], NH, f);
          EXPECT_EQ(attn->implementation(), path == 0 ? "fast" : "lab");
        }
        const std::string what = std::string(attention_kind_name(kind)) + " " + dtype_name(f) +
                                 " variant " + std::to_string(variant);
        EXPECT_TRUE(same_bits(out[0], out[1])) << what;
        EXPECT_TRUE(same_bits(lse[0], lse[1])) << what;
        EXPECT_TRUE(same_bits(dqkv[0], dqkv[1])) << what;
        ++layers;
      }
  std::printf("layer: %d settings, fast path and lab bit-equal\n", layers);
}

TEST(AttentionFast, StatisticsAndFp64RunTheLab) {
  // Statistics are the lab's (it computes them); FP64 tensors are the reference mode.
  AttentionConfig cfg;
  cfg.kind = AttentionKind::Flash;
  auto attn = make_attention_cpu(cfg);
  const int B = 1, T = 8, NH = 2, C = 16;
  Rng rng(3);
  Tensor qkv = Tensor::empty({B, T, 3 * C}, DType::F32);
  fill(qkv, rng, C, 1.0);
  Tensor out = Tensor::empty({B, T, C}, DType::F32), lse = Tensor::empty({B, NH, T}, DType::F32);
  attn->forward(out, lse, qkv, NH, DType::BF16);
  EXPECT_EQ(attn->implementation(), "fast");
  attn->set_collect_stats(true);
  attn->forward(out, lse, qkv, NH, DType::BF16);
  EXPECT_EQ(attn->implementation(), "lab");
  EXPECT_EQ(attn->stats().size(), static_cast<size_t>(NH));
  attn->set_collect_stats(false);
  Tensor q64 = Tensor::empty({B, T, 3 * C}, DType::F64), o64 = Tensor::empty({B, T, C}, DType::F64),
         l64 = Tensor::empty({B, NH, T}, DType::F64);
  for (int64_t i = 0; i < q64.numel(); ++i) q64.data<double>()[i] = qkv.data<float>()[i];
  attn->forward(o64, l64, q64, NH, DType::F64);
  EXPECT_EQ(attn->implementation(), "lab");
}
