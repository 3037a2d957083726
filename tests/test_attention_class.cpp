// Attention numerics, parts 4 and 5 of test_attention (one executable; the opening comment
// of test_attention.cpp lists the parts): the statistics through the Attention class on
// constructed scores, and the class itself: its packing, fp32_out_heads, the delta modes,
// and the CPU's refusal of cudnn.
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
