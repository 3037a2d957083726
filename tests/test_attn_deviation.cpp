// The numerics lab's experiments: the Qiu & Yao tied-maximum bias through the shared bias
// experiment (attention/experiments.h) at a small size, the findings of issue 21
// (docs/numerics.md), the dot-product entry point and the attn_deviation tool end to end. Judged by standard errors over rows, never by
// a ratio of two means one of which is noise (RESEARCH.md section 4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attention/deviation.h"
#include "attention/experiments.h"
#include "attention/head_cpu.h"
#include "backends/backends.h"
#include "core/rng.h"

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
  c.v = {InputDist::Kind::Normal, v_mean, v_std};
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

// ---- the dot-product entry point (head_forward_dots) against the q.k entry

namespace {

// q_r = e_{2r} + e_{2r+1}; k_s[2r] = hi, k_s[2r+1] = lo: q.k = hi + lo exactly (see
// experiments.h), so the two entry points must agree bit for bit.
struct ExactHead {
  int T = 96, d = 32;
  std::vector<double> q, k, v, dout, dots;
};

ExactHead exact_head(uint64_t seed) {
  ExactHead h;
  Rng rng(seed);
  const int T = h.T, d = h.d;
  h.q.assign(static_cast<size_t>(T) * d, 0.0);
  h.k.assign(h.q.size(), 0.0);
  h.v.resize(h.q.size());
  h.dout.resize(h.q.size());
  for (int r = 0; r < d / 2; ++r) {
    h.q[r * d + 2 * r] = h.q[r * d + 2 * r + 1] = 1.0;
    for (int s = 0; s < T; ++s) {
      const double X = 3.0 * rng.normal() * std::sqrt(double(d));
      const double hi = round_fmt(X, DType::BF16);
      h.k[s * d + 2 * r] = hi;
      h.k[s * d + 2 * r + 1] = round_fmt(X - hi, DType::BF16);
    }
  }
  for (double& x : h.v) x = round_fmt(rng.normal(), DType::BF16);
  for (double& x : h.dout) x = round_fmt(rng.normal(), DType::BF16);
  h.dots.assign(static_cast<size_t>(T) * T, 0.0);
  for (int t = 0; t < T; ++t)
    for (int s = 0; s < T; ++s)
      for (int j = 0; j < d; ++j) h.dots[t * T + s] += h.q[t * d + j] * h.k[s * d + j];
  return h;
}

}  // namespace

TEST(LabDots, MatchesTheQkEntryBitForBit) {
  const ExactHead h = exact_head(11);
  const int T = h.T, d = h.d, R = d / 2;  // rows 0..R-1 carry scores; the rest have q = 0
  for (AttentionKind kind :
       {AttentionKind::Baseline, AttentionKind::Flash, AttentionKind::StabilizedFlash})
    for (bool accum_low : {false, true})
      for (bool causal : {false, true}) {
        AttentionConfig c;
        c.kind = kind;
        c.causal = causal;
        c.block_k = 32;
        if (accum_low) c.accum = DType::BF16;
        const AttnNumerics n = c.numerics(DType::BF16, 0);
        HeadForward a, b;
        head_forward(c, n, T, d, h.q.data(), h.k.data(), h.v.data(), a, true);
        head_forward_dots(c, n, T, T, d, h.dots.data(), h.v.data(), b, true);
        const std::string what = std::string(attention_kind_name(kind)) +
                                 (accum_low ? " accum bf16" : " gpu") + (causal ? " causal" : "");
        EXPECT_EQ(a.o, b.o) << what;
        EXPECT_EQ(a.o32, b.o32) << what;
        EXPECT_EQ(a.lse, b.lse) << what;
        EXPECT_EQ(a.stats.tied_rows, b.stats.tied_rows) << what;
        for (DeltaMode m : {DeltaMode::O, DeltaMode::OSplit, DeltaMode::OFp32, DeltaMode::DpP,
                            DeltaMode::Fp32Recompute}) {
          c.delta = m;
          const AttnNumerics nm = c.numerics(DType::BF16, 0);
          EXPECT_EQ(head_deltas(c, nm, T, d, h.q.data(), h.k.data(), h.v.data(), a, h.dout.data()),
                    head_deltas_dots(c, nm, T, T, d, h.dots.data(), h.v.data(), b, h.dout.data()))
              << what << " delta " << delta_mode_name(m);
        }
        if (causal) continue;
        // Rectangular: the first R rows alone (non-causal rows do not see each other).
        HeadForward r;
        head_forward_dots(c, n, R, T, d, h.dots.data(), h.v.data(), r);
        ASSERT_EQ(r.o.size(), static_cast<size_t>(R) * d);
        EXPECT_TRUE(std::equal(r.o.begin(), r.o.end(), a.o.begin())) << what << " rectangular";
        EXPECT_TRUE(std::equal(r.lse.begin(), r.lse.end(), a.lse.begin())) << what;
      }
}

TEST(LabDots, CausalNeedsSquareInputs) {
  const ExactHead h = exact_head(3);
  AttentionConfig c;
  c.causal = true;
  HeadForward fw;
  EXPECT_THROW(head_forward_dots(c, c.numerics(DType::BF16, 0), 16, h.T, h.d, h.dots.data(),
                                 h.v.data(), fw),
               std::exception);
}

// ---- Finding 1 (issue 21): three or more tied maxima defeat stabilized flash

namespace {

BiasReport ties_run(int ties, TieShift shift, const std::vector<double>& betas, double spread,
                    bool lsum_fp32 = false) {
  BiasConfig c;
  if (lsum_fp32) c.lsum = DType::F32;
  c.rows = 4096;
  c.ties = ties;
  c.kinds = {BiasRows::TiedTile};
  c.accums = {BiasAccum::Bf16};
  c.baseline = false;
  c.deltas = false;
  c.v = {InputDist::Kind::Normal, 0.7, 0.3};
  c.betas = betas;
  c.tie_shift = shift;
  c.top_spread = spread;
  c.seed = 21;
  return run_bias_experiment(c);
}

const BiasSeries& series(const BiasReport& r, const std::string& backend) {
  const BiasSeries* s = r.find(BiasRows::TiedTile, BiasAccum::Bf16, backend, "o");
  EXPECT_NE(s, nullptr) << backend;
  static const BiasSeries none{};
  return s ? *s : none;
}

}  // namespace

// The setting (every row's maximum at +5, V ~ N(0.7, 0.3), d 32, 512 keys, tiles of
// 64, BF16 O~): with three ties, beta = 2 and 3 push O the other way, harder than flash's
// own bias. Cause: l = 3 P~ needs two more bits than P~ and is rounded to BF16.
TEST(AttnBias, ThreeTiesDefeatTheBetaShift) {
  const BiasReport r = ties_run(3, TieShift::Beta, {2, 3}, 0);
  const BiasSeries& fl = series(r, "flash");
  std::printf("  3 ties, top 5: %s\n", describe(fl).c_str());
  EXPECT_GT(fl.mean, 10 * fl.se) << describe(fl);
  for (const char* b : {"stabilized_b2", "stabilized_b3"}) {
    const BiasSeries& st = series(r, b);
    std::printf("  3 ties, top 5: %s\n", describe(st).c_str());
    EXPECT_LT(st.mean, -10 * st.se) << describe(st);
    EXPECT_GT(std::fabs(st.mean), std::fabs(fl.mean)) << describe(st);
  }
}

// The two remedies: tie_shift = exact_sum (the shifted maximum moves until ties * P~ is
// exact in l's format) and lsum = fp32 (l kept in FP32 while O~ stays BF16). Maxima spread
// over U(4, 6) per row, so P~ differs between rows and no single value of it decides the
// result. At 3 and 5 ties the beta shift is defeated (bias at least half of flash's,
// opposite sign); with either remedy the bias at every tie count 2..5 is under 40% of
// flash's (measured 8-35%). Neither is zero: stabilized flash keeps a residual of 3-8e-5 at
// every tie count, 2 included -- along sign(V) with exact_sum, against it with an FP32 l
// (docs/numerics.md).
TEST(AttnBias, RemediesHoldAtTwoToFiveTies) {
  for (int ties = 2; ties <= 5; ++ties) {
    const BiasReport plain = ties_run(ties, TieShift::Beta, {2, 7}, 2.0);
    const BiasReport exact = ties_run(ties, TieShift::ExactSum, {2, 7}, 2.0);
    const BiasReport wide_l = ties_run(ties, TieShift::Beta, {2, 7}, 2.0, true);
    const BiasSeries& fl = series(plain, "flash");
    EXPECT_GT(fl.mean, 10 * fl.se) << ties << " ties: " << describe(fl);
    for (const char* b : {"stabilized_b2", "stabilized_b7"}) {
      const BiasSeries& p = series(plain, b);
      const BiasSeries& e = series(exact, std::string(b) + "_exact_sum");
      std::printf("  %d ties, top U(4,6): %s | %s | %s\n", ties, describe(fl).c_str(),
                  describe(p).c_str(), describe(e).c_str());
      const BiasSeries& w = series(wide_l, b);
      std::printf("  %d ties, top U(4,6), lsum fp32: %s\n", ties, describe(w).c_str());
      EXPECT_LT(std::fabs(e.mean), 0.4 * fl.mean) << ties << " ties: " << describe(e);
      EXPECT_LT(std::fabs(w.mean), 0.4 * fl.mean) << ties << " ties, lsum fp32: " << describe(w);
      if (ties == 3 || ties == 5) {
        EXPECT_LT(p.mean, -0.5 * fl.mean) << ties << " ties: " << describe(p);
      }
    }
  }
}

// ---- Finding 2 (issue 21): baseline's every_mac error comes from the BF16 row sum

TEST(AttnDeviation, EveryMacBaselineErrorIsTheRowSum) {
  auto err = [](const char* rule, const char* lsum_mac) {
    DeviationSpec s;
    set_spec_field(s, "backend", "baseline");
    set_spec_field(s, "rule", rule);
    set_spec_field(s, "lsum_mac", lsum_mac);
    set_spec_field(s, "T", "1024");
    set_spec_field(s, "heads", "2");
    s.deltas = false;
    double e = 0;
    for (const auto& h : run_deviation(s, 0)) e += h.o32.mean() / 2;
    std::printf("  baseline %s, row-sum partial sums %s: mean |O32 - O_gold| %.3e\n", rule,
                lsum_mac, e);
    return e;
  };
  const double all = err("every_mac", "auto");          // every sum in BF16
  const double matmuls = err("every_mac", "fp32");      // row sum wide, matmul sums BF16
  const double rowsum = err("every_op", "bf16");        // only the row sum's partials BF16
  const double none = err("every_op", "auto");          // no BF16 partial sums
  // Measured (T 1024, d 64, V ~ N(0, 1)): 8.1e-3, 1.8e-3, 7.7e-3, 3.4e-4. Only for V with
  // mean 0: with V ~ N(0.7, 0.3) the P V partial sums stagnate too, in the opposite
  // direction, and the two errors partly cancel (bench/results/attn_rowsum_error.md).
  EXPECT_GT(rowsum - none, 0.8 * (all - none));
  EXPECT_LT(matmuls - none, 0.3 * (all - none));
}

// ---- attn_deviation end to end

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST(AttnDeviationTool, RunWritesTidyCsvAndSidecar) {
  const std::string csv = ::testing::TempDir() + "attn_run.csv";
  const std::string cmd = std::string(ST_ATTN_DEVIATION_BIN) +
                          " run --backend stabilized_flash --beta 3 --T 100 --d 96 --tile 32x48"
                          " --v normal:0.7:0.3 --ties 3 --tie-gap 0 --heads 3 --csv " + csv +
                          " > " + csv + ".out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(csv + ".out");
  const std::string text = slurp(csv);
  EXPECT_EQ(lines(text), 4);  // header + one row per head
  EXPECT_EQ(text.find('#'), std::string::npos);
  EXPECT_NE(text.find("stabilized_flash,3,beta,bf16,gpu,100,96,1,32,48,"), std::string::npos) << text;
  EXPECT_NE(slurp(csv + ".json").find("\"command\""), std::string::npos);
  const std::string out = slurp(csv + ".out");
  EXPECT_NE(out.find("mean ± SE over 3 heads"), std::string::npos) << out;
  // Every row with at least 3 keys has its 3 tied maxima (tie_gap 0: tied with the next too).
  EXPECT_NE(text.find(",98,100,"), std::string::npos) << text;
}

TEST(AttnDeviationTool, BadInputIsOneLineNamingTheSetting) {
  const std::string out = ::testing::TempDir() + "attn_bad.out";
  const std::string cmd = std::string(ST_ATTN_DEVIATION_BIN) + " run --v normal:x > " + out + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  const std::string text = slurp(out);
  EXPECT_NE(text.find("v: distribution: 'normal:x' has 'x' where a number belongs"), std::string::npos)
      << text;
  EXPECT_EQ(lines(text), 1) << text;
  // cudnn is a GPU backend: the CPU lab refuses it, by name.
  const std::string cmd2 = std::string(ST_ATTN_DEVIATION_BIN) + " run --backend cudnn > " + out + " 2>&1";
  EXPECT_NE(std::system(cmd2.c_str()), 0);
  const std::string text2 = slurp(out);
  EXPECT_NE(text2.find("backend cudnn runs only on a GPU"), std::string::npos) << text2;
  EXPECT_EQ(lines(text2), 1) << text2;
}

TEST(AttnDeviationTool, BiasTakesTheOTildeAmplifierAndItsScope) {
  // attn_deviation bias with O~ narrowed to 2 bits on tied tiles (one tile per row): tied
  // rows' error grows (mean |err| 30x BF16's here), single rows are bit-for-bit untouched.
  const std::string dir = ::testing::TempDir();
  const auto run = [&](const std::string& flags, const std::string& name) {
    const std::string csv = dir + name + ".csv";
    const std::string cmd = std::string(ST_ATTN_DEVIATION_BIN) +
                            " bias --rows 256 --keys 64 --block-k 64 --kinds tied_tile,single"
                            " --accums bf16_accum --no-deltas --no-baseline --betas 2 --seed 3 " +
                            flags + " --csv " + csv + " > " + csv + ".out 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(csv + ".out");
    std::map<std::string, std::vector<std::string>> rows;  // kind,backend,quantity -> fields
    std::istringstream in(slurp(csv));
    std::string line;
    while (std::getline(in, line)) {
      std::vector<std::string> f;
      std::istringstream ls(line);
      for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
      if (f.size() > 11) rows[f[0] + "," + f[2] + "," + f[3]] = f;
    }
    return rows;
  };
  auto plain = run("", "bias_plain");
  auto amp = run("--o-tilde-bits 2 --o-tilde-scope tied", "bias_tied2");
  for (const char* b : {"flash", "stabilized_b2"}) {
    const std::string single = std::string("single,") + b + ",o", tied = std::string("tied_tile,") + b + ",o";
    ASSERT_EQ(plain.count(single) + amp.count(single) + plain.count(tied) + amp.count(tied), 4u) << b;
    EXPECT_EQ(plain[single][8], amp[single][8]) << b;    // mean
    EXPECT_EQ(plain[single][11], amp[single][11]) << b;  // mean |err|
    EXPECT_GT(std::stod(amp[tied][11]), 10 * std::stod(plain[tied][11])) << b;
  }
  // A scope without the bits is a one-line error naming the flag.
  const std::string out = dir + "bias_bad.out";
  const std::string bad = std::string(ST_ATTN_DEVIATION_BIN) + " bias --o-tilde-scope tied > " + out + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_NE(slurp(out).find("--o-tilde-scope tied needs --o-tilde-bits"), std::string::npos) << slurp(out);
  EXPECT_EQ(lines(slurp(out)), 1) << slurp(out);
  // attn_deviation run takes the same settings.
  const std::string cmd = std::string(ST_ATTN_DEVIATION_BIN) +
                          " run --backend flash --accum bf16 --o-tilde-bits 2 --o-tilde-scope "
                          "untied_matched --tie-break 0.004 --T 32 --d 8 --ties 2 --heads 2 > " +
                          out + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(out);
}

TEST(AttnDeviationTool, SweepPlanGivesPairedRatios) {
  const std::string dir = ::testing::TempDir();
  const std::string plan = dir + "attn_plan.yaml";
  std::ofstream(plan) << "defaults: {d: 32, causal: true, deltas: false}\n"
                         "groups:\n"
                         "  - name: tiny\n"
                         "    axes: {rule: [gpu, every_op], T: [64, 96]}\n"
                         "    heads: {64: 3, 96: 2}\n"
                         "    skip: [{rule: every_op, T: 96}]\n"
                         "    ratio: {num: {backend: flash, tile: 16x16}, den: {backend: baseline}}\n";
  const std::string csv = dir + "attn_sweep.csv";
  const std::string cmd = std::string(ST_ATTN_DEVIATION_BIN) + " sweep --plan-file " + plan +
                          " --csv " + csv + " > " + csv + ".out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(csv + ".out");
  // 3 axis points x 2 runs; heads 3 + 3 + 3 + 3 + 2 + 2.
  EXPECT_EQ(lines(slurp(csv)), 1 + 16);
  const std::string ratios = slurp(dir + "attn_sweep_ratios.csv");
  EXPECT_EQ(lines(ratios), 1 + 3) << ratios;
  EXPECT_NE(slurp(csv + ".out").find("| gpu | 64 | 3 |"), std::string::npos) << slurp(csv + ".out");
}

// attn_deviation apply runs the trainer's forward (make_backend -> make_attention -> forward)
// on a file: its O is bit for bit the CPU backend's O in-process, for every CPU backend and
// accumulator, and the FP64 baseline's O equals the in-process FP64 one. Inputs: random BF16
// values, keys 3 and 7 identical (a tied pair in every row), non-causal.
TEST(AttnDeviationTool, ApplyIsTheTrainersForwardOnAFile) {
  const int B = 2, T = 40, NH = 2, hs = 16, C = NH * hs;
  Rng rng(17);
  std::vector<uint16_t> bits(static_cast<size_t>(B) * T * 3 * C);
  Tensor qkv32 = Tensor::empty({B, T, 3 * C}, DType::F32);
  Tensor qkv64 = Tensor::empty({B, T, 3 * C}, DType::F64);
  for (size_t i = 0; i < bits.size(); ++i) {
    const int col = static_cast<int>(i % (3 * C));
    const size_t row = i / (3 * C);
    // key 7 repeats key 3 (same b): a tie in every query row
    const size_t src = (row % T == 7 && col >= C && col < 2 * C) ? i - 4 * 3 * C : i;
    bits[i] = src == i ? float_to_bf16_bits(static_cast<float>(2.0 * rng.normal())) : bits[src];
    qkv32.data<float>()[i] = bf16_bits_to_float(bits[i]);
    qkv64.data<double>()[i] = bf16_bits_to_float(bits[i]);
  }
  const std::string dir = ::testing::TempDir();
  const std::string in = dir + "apply_qkv.bin", out = dir + "apply_o.bin", log = dir + "apply.out";
  {
    std::ofstream f(in, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bits.data()), static_cast<std::streamsize>(bits.size() * 2));
  }
  const std::string bin = std::string(ST_ATTN_DEVIATION_BIN) + " apply --qkv " + in + " --out " + out;
  const std::string base = bin + " --B 2 --T 40 --NH 2 --hs 16";
  auto be = make_cpu_backend();
  struct Case {
    AttentionKind kind;
    bool bf16_accum;
    std::string flags;
  };
  const Case cases[] = {{AttentionKind::Baseline, false, "--backend baseline"},
                        {AttentionKind::Flash, false, "--backend flash --block-k 16"},
                        {AttentionKind::Flash, true, "--backend flash --block-k 16 --accum bf16"},
                        {AttentionKind::StabilizedFlash, true,
                         "--backend stabilized_flash --beta 2 --block-k 16 --accum bf16 --chunk 1"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    ASSERT_EQ(std::system((base + " " + c.flags + " > " + log + " 2>&1").c_str()), 0) << slurp(log);
    std::vector<uint16_t> got(static_cast<size_t>(B) * T * C);
    std::ifstream f(out, std::ios::binary);
    f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size() * 2));
    ASSERT_EQ(f.gcount(), static_cast<std::streamsize>(got.size() * 2));
    AttentionConfig cfg;
    cfg.kind = c.kind;
    cfg.causal = false;
    cfg.block_k = 16;
    if (c.bf16_accum) cfg.accum = DType::BF16;
    auto attn = be->make_attention(cfg);
    Tensor o = Tensor::empty({B, T, C}, DType::F32), lse = Tensor::empty({B, NH, T}, DType::F32);
    attn->forward(o, lse, qkv32, NH, DType::BF16);
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += bf16_bits_to_float(got[i]) != o.data<float>()[i];
    EXPECT_EQ(differ, 0);
  }
  // FP64: raw doubles, the lab's golden.
  ASSERT_EQ(std::system((base + " --backend baseline --compute fp64 > " + log + " 2>&1").c_str()), 0)
      << slurp(log);
  std::vector<double> got(static_cast<size_t>(B) * T * C);
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size() * 8));
  ASSERT_EQ(f.gcount(), static_cast<std::streamsize>(got.size() * 8));
  AttentionConfig cfg;
  cfg.causal = false;
  Tensor o = Tensor::empty({B, T, C}, DType::F64), lse = Tensor::empty({B, NH, T}, DType::F64);
  be->make_attention(cfg)->forward(o, lse, qkv64, NH, DType::F64);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], o.data<double>()[i]) << i;

  // Refusals: one line each, non-zero exit.
  const std::pair<std::string, std::string> bad[] = {
      {" --backend flash --bogus 1", "--bogus"},
      {" --backend flash --beta 3", "--beta applies to --backend stabilized_flash only"},
      {" --backend nope", "unknown attention backend 'nope'"},
      {"", "15360 bytes, expected 15744"},  // --T 41 (below)
      {" --backend cudnn", "cudnn"}};
  for (const auto& [flags, want] : bad) {
    SCOPED_TRACE(flags);
    const std::string cmd = flags.empty() ? bin + " --B 2 --T 41 --NH 2 --hs 16 --backend flash"
                                          : base + flags;
    EXPECT_NE(std::system((cmd + " > " + log + " 2>&1").c_str()), 0);
    const std::string text = slurp(log);
    EXPECT_NE(text.find(want), std::string::npos) << text;
    EXPECT_EQ(lines(text), 1) << text;
  }
  if (!cuda_available()) {
    EXPECT_NE(std::system((base + " --backend flash --device cuda > " + log + " 2>&1").c_str()), 0);
    const std::string text = slurp(log);
    EXPECT_NE(text.find("--device cuda"), std::string::npos) << text;
    EXPECT_EQ(lines(text), 1) << text;
  }
}
