// The `compare` tool end to end on tiny runs of the real `train` binary: identical runs give
// exactly 0, other seeds are cross-checked against scipy by an independent Python reader,
// checkpoints of different steps are paired exactly or with the nearest step, runs of
// different lengths, shapes or without checkpoints still compare their losses, and every
// class of bad input gives one line on stderr and writes nothing. (The weight-distance
// library: test_compare.cpp; the shared harness: compare_fixture.h.)
//
// Suite names start with "compare_" so that `ctest -R compare` selects them all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/slices.h"
#include "analysis/weight_distance.h"
#include "core/error.h"
#include "core/rng.h"
#include "compare_fixture.h"
#include "io/checkpoint.h"
#include "model_shapes.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace st;
using namespace st::compare_test;
using st::test::slurp;

// ---------------------------------------------------------------- the tool, end to end

TEST(compare_Tool, SameConfigGivesExactlyZero) {
  const std::string a = train_run("a"), b = train_run("b");
  const fs::path out = fresh_out_dir("same");
  const Cmd c = compare(a + " " + b + " -o " + (out / "compare.csv").string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("losses identical"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("weights identical"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("weights:     2 checkpoint pairs: 2 exact, 0 nearest; largest step gap 0\n"),
            std::string::npos) << c.out;
  // Whole-tensor rows carry -1 for "not per layer / head", as text.
  const auto text = lines_of(slurp(out / "compare.csv"));
  ASSERT_GE(text.size(), 3u);
  EXPECT_EQ(text[1].rfind("a,b,10,10,10,exact,wte,-1,-1,0,0,0", 0), 0u) << text[1];
  EXPECT_EQ(text[2].rfind("a,b,10,10,10,exact,wpe,-1,-1,", 0), 0u) << text[2];
  const auto rows = read_compare_csv(out / "compare.csv");
  ASSERT_EQ(rows.size(), 2 * slices_per_step());  // steps 10 and 20
  for (const auto& r : rows) {
    EXPECT_EQ(r.run_a, "a");
    EXPECT_EQ(r.run_b, "b");
    EXPECT_TRUE(r.step == 10 || r.step == 20) << r.step;
    EXPECT_EQ(r.step_b, r.step);
    EXPECT_EQ(r.pairing, "exact");
    EXPECT_EQ(r.w1, 0.0) << r.tensor << " " << r.layer << " " << r.head;
    EXPECT_EQ(r.w1n, 0.0);
    EXPECT_EQ(r.mad, 0.0);
  }
  // The loss CSV: 20 steps of both runs, differences exactly 0, val_loss at 10 and 20.
  const auto loss = lines_of(slurp(out / "compare_loss.csv"));
  ASSERT_EQ(loss.size(), 1u + 2 * 20);
  EXPECT_EQ(loss[0], "step,run,loss,val_loss,loss_diff_vs_a");
  int vals = 0;
  for (size_t i = 1; i < loss.size(); ++i) {
    const auto f = split(loss[i]);
    ASSERT_EQ(f.size(), 5u) << loss[i];
    EXPECT_EQ(f[1], i % 2 ? "a" : "b");
    EXPECT_EQ(std::stoll(f[0]), int64_t((i + 1) / 2));
    EXPECT_EQ(f[4], "0") << loss[i];
    EXPECT_GT(std::stod(f[2]), 0);
    vals += !f[3].empty();
  }
  EXPECT_EQ(vals, 4);
}

TEST(compare_Tool, DifferentSeedIsNonzeroAndMatchesScipy) {
  const std::string a = train_run("a"), b = train_run("b"), c = train_run("seed8", "--set run.seed=8");
  const fs::path out = fresh_out_dir("seed");
  const fs::path csv = out / "compare.csv";
  const Cmd r = compare(a + " " + b + " " + c + " -o " + csv.string() + " --top 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("differs in run.seed 7 vs 8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first differing step 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("least squares"), std::string::npos) << r.out;
  const auto rows = read_compare_csv(csv);
  ASSERT_EQ(rows.size(), 2 * 2 * slices_per_step());  // two pairs, two steps
  size_t n_seed = 0;
  for (const auto& row : rows) {
    if (row.run_b != "seed8") continue;
    ++n_seed;
    // Every matrix and every vector that is not still at its initial constant differs.
    if (row.tensor != "ln1b" && row.tensor != "ln2b" && row.tensor != "lnfb" &&
        row.tensor != "qkvb" && row.tensor != "attprojb" && row.tensor != "fcb" &&
        row.tensor != "fcprojb" && row.tensor != "ln1w" && row.tensor != "ln2w" &&
        row.tensor != "lnfw") {
      EXPECT_GT(row.w1, 0) << row.tensor << " " << row.layer << " " << row.head;
      EXPECT_GT(row.mad, 0) << row.tensor;
      EXPECT_GT(row.w1n, 0) << row.tensor;
    }
    EXPECT_GE(row.mad, row.w1) << "max |a - b| bounds W1 (the identity coupling)";
  }
  EXPECT_EQ(n_seed, 2 * slices_per_step());

  // Independent reader + scipy on the real checkpoints of the two different-seed runs.
  const Cmd py = run_cmd("/usr/bin/python3 " ST_W1_SCIPY_SCRIPT " " + csv.string() + " " + a +
                         " " + c);
  ASSERT_EQ(py.code, 0) << "scipy cross-check failed (needs /usr/bin/python3 with numpy and "
                           "scipy: Debian python3-numpy python3-scipy):\n"
                        << py.out << py.err;
  long long checked = 0;
  ASSERT_EQ(std::sscanf(py.out.c_str(), "checked %lld rows", &checked), 1) << py.out;
  EXPECT_EQ(checked, static_cast<long long>(2 * slices_per_step())) << py.out;
  EXPECT_NE(py.out.find(" 0 mismatches"), std::string::npos) << py.out;

  // Two checkpoint files: the same rows as the run-directory comparison at that step.
  const fs::path csv2 = out / "files.csv";
  const Cmd f = compare(a + "/ckpt_00000010.bin " + c + "/ckpt_00000010.bin -o " + csv2.string());
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_FALSE(fs::exists(out / "files_loss.csv")) << "no loss curves for checkpoint files";
  const auto frows = read_compare_csv(csv2);
  std::vector<CsvRow> want;
  for (const auto& row : rows)
    if (row.run_b == "seed8" && row.step == 10) want.push_back(row);
  ASSERT_EQ(frows.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(frows[i].run_a, "a");
    EXPECT_EQ(frows[i].run_b, "seed8");
    EXPECT_EQ(frows[i].step, 10);
    EXPECT_EQ(frows[i].tensor, want[i].tensor);
    EXPECT_EQ(frows[i].w1, want[i].w1);
    EXPECT_EQ(frows[i].mad, want[i].mad);
  }
}

// Runs of different model shapes: the losses are compared (a smaller model's curve against a
// larger one's is a comparison researchers make); the weights cannot be, and one line says so.
TEST(compare_Tool, DifferentShapeComparesLossesOnly) {
  const std::string a = train_run("a"), d = train_run("layers3", "--set model.n_layer=3");
  const fs::path out = fresh_out_dir("shape");
  const Cmd c = compare(a + " " + d + " -o " + (out / "compare.csv").string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("weights:     not compared: different model shapes: n_layer 2 vs 3 (" + a +
                       "/config.yaml, " + d + "/config.yaml); losses only\n"),
            std::string::npos) << c.out;
  EXPECT_NE(c.out.find("loss:        20 shared steps (1..20); first differing step 1"),
            std::string::npos) << c.out;
  EXPECT_TRUE(read_compare_csv(out / "compare.csv").empty()) << "the header only";
  EXPECT_EQ(lines_of(slurp(out / "compare_loss.csv")).size(), 1u + 2 * 20);
  // Without config.yaml the checkpoints tell the shapes apart: the same, from the files.
  const fs::path noconf = tmp_root() / "layers3_noconf";
  fs::remove_all(noconf);
  fs::copy(d, noconf);
  fs::remove(noconf / "config.yaml");
  const Cmd n = compare(a + " " + noconf.string() + " -o " + (out / "compare.csv").string());
  ASSERT_EQ(n.code, 0) << n.err;
  EXPECT_NE(n.out.find("weights:     not compared: different model shapes: n_layer 2 vs 3 (" +
                       ckpt(a, 10) + ", " + ckpt(noconf.string(), 10) + "); losses only"),
            std::string::npos) << n.out;
  EXPECT_TRUE(read_compare_csv(out / "compare.csv").empty());
  // --step asks for weights: an error naming the shapes.
  const fs::path out2 = fresh_out_dir("shape_step");
  const Cmd s = compare(a + " " + d + " --step 20 -o " + (out2 / "compare.csv").string());
  expect_one_line_error(s, out2);
  EXPECT_NE(s.err.find("n_layer 2 vs 3"), std::string::npos) << s.err;
  // Two checkpoint files are weights only: an error naming both files.
  const Cmd f = compare(a + "/ckpt_00000020.bin " + d + "/ckpt_00000020.bin -o " +
                        (out2 / "compare.csv").string());
  expect_one_line_error(f, out2);
  EXPECT_NE(f.err.find("n_layer 2 vs 3"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find(a + "/ckpt_00000020.bin"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find(d + "/ckpt_00000020.bin"), std::string::npos) << f.err;
}

TEST(compare_Tool, MissingStepAndNoSharedStep) {
  const std::string a = train_run("a"), b = train_run("b");
  const fs::path out = fresh_out_dir("steps");
  const std::string o = " -o " + (out / "compare.csv").string();
  const Cmd s = compare(a + " " + b + " --step 15" + o);
  expect_one_line_error(s, out);
  EXPECT_NE(s.err.find("--step 15"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("10 20"), std::string::npos) << s.err;
  // --step of a step both have: only that step.
  const Cmd ok = compare(a + " " + b + " --step 20" + o);
  ASSERT_EQ(ok.code, 0) << ok.err;
  for (const auto& r : read_compare_csv(out / "compare.csv")) EXPECT_EQ(r.step, 20);
  fs::remove_all(out);
  fs::create_directories(out);
  // keep_checkpoints pruned step 10 in one run: run A's 10 pairs with its 20 (nearest), and
  // with --max-step-gap 0 only 20 is compared; the console says which.
  const std::string k = train_run("keep1", "--set train.keep_checkpoints=1");
  const Cmd kc = compare(a + " " + k + o);
  ASSERT_EQ(kc.code, 0) << kc.err;
  EXPECT_NE(kc.out.find("keep1 has 20; compared: 10~20 20\n"), std::string::npos) << kc.out;
  EXPECT_NE(kc.out.find("2 checkpoint pairs: 1 exact, 1 nearest; largest step gap 10 (a 10 vs "
                        "keep1 20)"), std::string::npos) << kc.out;
  const auto kr = read_compare_csv(out / "compare.csv");
  ASSERT_EQ(kr.size(), 2 * slices_per_step());
  EXPECT_EQ(kr.front().step_a, 10);
  EXPECT_EQ(kr.front().step_b, 20);
  EXPECT_EQ(kr.front().pairing, "nearest");
  EXPECT_EQ(kr.back().pairing, "exact");
  const Cmd k0 = compare(a + " " + k + " --max-step-gap 0" + o);
  ASSERT_EQ(k0.code, 0) << k0.err;
  EXPECT_NE(k0.out.find("keep1 has 20; compared: 20\n"), std::string::npos) << k0.out;
  EXPECT_NE(k0.out.find("1 checkpoint pairs: 1 exact, 0 nearest; largest step gap 0; not "
                        "compared, no checkpoint of keep1 within --max-step-gap: a 10\n"),
            std::string::npos) << k0.out;
  EXPECT_EQ(read_compare_csv(out / "compare.csv").size(), slices_per_step());
  fs::remove_all(out);
  fs::create_directories(out);
  const Cmd neg = compare(a + " " + k + " --max-step-gap -1" + o);
  expect_one_line_error(neg, out);
  EXPECT_NE(neg.err.find("--max-step-gap"), std::string::npos) << neg.err;
  // --step N of run A's whose pair is too far apart: an error saying so.
  const Cmd sf = compare(a + " " + k + " --step 10 --max-step-gap 5" + o);
  expect_one_line_error(sf, out);
  EXPECT_NE(sf.err.find("no checkpoint of 'keep1' within --max-step-gap 5"), std::string::npos)
      << sf.err;
}

// Issue 23: runs checkpointed at different steps. ckpt_every 3 and 4 over 12 steps: run A's
// 3 6 9 12 against 4 8 12 -> 3~4, 6~4 (a tie: the earlier step), 9~8 nearest and 12 exact.
// Same seed and data: the weights at 12 are identical, and every nearest pair's row is the
// distance between exactly those two checkpoint files.
TEST(compare_Tool, DisjointCheckpointStepsPairNearest) {
  const std::string e3 = train_run("e3", "--set train.max_steps=12 --set train.ckpt_every=3");
  const std::string e4 = train_run("e4", "--set train.max_steps=12 --set train.ckpt_every=4");
  const fs::path out = fresh_out_dir("disjoint");
  const fs::path csv = out / "compare.csv";
  const Cmd c = compare(e3 + " " + e4 + " -o " + csv.string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("checkpoints: e3 has 3 6 9 12; e4 has 4 8 12; compared: 3~4 6~4 9~8 12\n"),
            std::string::npos) << c.out;
  EXPECT_NE(c.out.find("weights:     4 checkpoint pairs: 1 exact, 3 nearest; largest step gap 2 "
                       "(e3 6 vs e4 4)\n"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("step 9 (e4 step 8, nearest): W1 aggregate"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("losses identical"), std::string::npos) << c.out;
  const auto rows = read_compare_csv(csv);
  ASSERT_EQ(rows.size(), 4 * slices_per_step());
  const std::vector<std::pair<int64_t, int64_t>> want = {{3, 4}, {6, 4}, {9, 8}, {12, 12}};
  for (const auto& [sa, sb] : want) {
    const auto at = rows_at(rows, "e4", sa);
    ASSERT_EQ(at.size(), slices_per_step()) << sa;
    for (const auto& r : at) {
      EXPECT_EQ(r.step_b, sb) << sa;
      EXPECT_EQ(r.pairing, sa == sb ? "exact" : "nearest");
    }
    expect_rows_match_checkpoints(at, ckpt(e3, sa), ckpt(e4, sb));
  }
  for (const auto& r : rows_at(rows, "e4", 12)) EXPECT_EQ(r.w1, 0.0) << r.tensor;
  double wte_9 = 0;
  for (const auto& r : rows_at(rows, "e4", 9))
    if (r.tensor == "wte") wte_9 = r.w1;
  EXPECT_GT(wte_9, 0) << "steps 9 and 8 differ";

  // The independent reader reads the step_a / step_b checkpoints too.
  const Cmd py = run_cmd("/usr/bin/python3 " ST_W1_SCIPY_SCRIPT " " + csv.string() + " " + e3 +
                         " " + e4);
  ASSERT_EQ(py.code, 0) << py.out << py.err;
  EXPECT_NE(py.out.find("checked " + std::to_string(4 * slices_per_step()) + " rows at 4 "
                        "checkpoint pairs"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find(" 0 mismatches"), std::string::npos) << py.out;

  // --max-step-gap 1: 6 has no checkpoint of e4 within 1 step; the others stay.
  const Cmd g = compare(e3 + " " + e4 + " --max-step-gap 1 -o " + csv.string());
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_NE(g.out.find("weights:     3 checkpoint pairs: 1 exact, 2 nearest; largest step gap 1 "
                       "(e3 3 vs e4 4); not compared, no checkpoint of e4 within --max-step-gap: "
                       "e3 6\n"), std::string::npos) << g.out;
  const auto grows = read_compare_csv(csv);
  EXPECT_EQ(grows.size(), 3 * slices_per_step());
  EXPECT_TRUE(rows_at(grows, "e4", 6).empty());
  // --step of a step run B lacks: its nearest.
  const Cmd st = compare(e3 + " " + e4 + " --step 9 -o " + csv.string());
  ASSERT_EQ(st.code, 0) << st.err;
  const auto srows = read_compare_csv(csv);
  ASSERT_EQ(srows.size(), slices_per_step());
  EXPECT_EQ(srows.front().step_b, 8);
  // Two checkpoint files of different steps: pairing "given".
  const Cmd f = compare(ckpt(e3, 9) + " " + ckpt(e4, 8) + " -o " + csv.string());
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.out.find("(step 8) vs " + ckpt(e3, 9) + " (step 9)"), std::string::npos) << f.out;
  const auto flines = lines_of(slurp(csv));
  ASSERT_EQ(flines.size(), 1 + slices_per_step());
  EXPECT_EQ(flines[1].rfind("e3,e4,9,9,8,given,wte,-1,-1,", 0), 0u) << flines[1];
}

// Runs with no checkpoint step in common, of different lengths: 10 steps checkpointed at 5 and
// 10 (run A) against 12 steps at 4, 8 and 12. Losses over the common range 1..10; weights 5~4
// and 10~8 (8 and 12 are equally near: the earlier one).
TEST(compare_Tool, NoCommonCheckpointAndDifferentLengths) {
  const std::string s10 = train_run("s10", "--set train.max_steps=10 --set train.ckpt_every=5");
  const std::string e4 = train_run("e4", "--set train.max_steps=12 --set train.ckpt_every=4");
  const fs::path out = fresh_out_dir("nocommon");
  const fs::path csv = out / "compare.csv";
  const Cmd c = compare(s10 + " " + e4 + " -o " + csv.string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("loss:        10 shared steps (1..10), the range both runs logged (s10 "
                       "1..10, e4 1..12); first differing step"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("compared: 5~4 10~8\n"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("weights:     2 checkpoint pairs: 0 exact, 2 nearest; largest step gap 2 "
                       "(s10 10 vs e4 8)\n"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("W1 also holds the weights' own change over the step gap"),
            std::string::npos) << c.out;
  const auto rows = read_compare_csv(csv);
  ASSERT_EQ(rows.size(), 2 * slices_per_step());
  expect_rows_match_checkpoints(rows_at(rows, "e4", 5), ckpt(s10, 5), ckpt(e4, 4));
  expect_rows_match_checkpoints(rows_at(rows, "e4", 10), ckpt(s10, 10), ckpt(e4, 8));
  for (const auto& r : rows) EXPECT_EQ(r.pairing, "nearest");
  // The loss CSV holds both curves whole; the difference only where run A logged a loss.
  const auto loss = lines_of(slurp(out / "compare_loss.csv"));
  ASSERT_EQ(loss.size(), 1u + 10 + 12);
  for (size_t i : {loss.size() - 2, loss.size() - 1}) {  // steps 11 and 12: e4 only
    const auto f = split(loss[i]);
    ASSERT_EQ(f.size(), 5u) << loss[i];
    EXPECT_EQ(f[0], std::to_string(i == loss.size() - 2 ? 11 : 12)) << loss[i];
    EXPECT_EQ(f[1], "e4") << loss[i];
    EXPECT_GT(std::stod(f[2]), 0) << loss[i];
    EXPECT_EQ(f[4], "") << loss[i];
  }
  // Step 10: run A's row, then e4's with its difference (the cosine schedules differ with
  // max_steps, so the losses do too).
  const auto fa = split(loss[2 * 10 - 1]), fb = split(loss[2 * 10]);
  ASSERT_EQ(fa.size(), 5u);
  ASSERT_EQ(fb.size(), 5u);
  EXPECT_EQ(fa[0] + "," + fa[1] + "," + fa[4], "10,s10,0") << loss[2 * 10 - 1];
  EXPECT_EQ(fb[0] + "," + fb[1], "10,e4") << loss[2 * 10];
  EXPECT_EQ(std::stod(fb[4]), std::stod(fb[2]) - std::stod(fa[2])) << loss[2 * 10];
  char last[128];
  std::snprintf(last, sizeof last, "; at the last shared step 10: s10 %.6f, e4 %.6f\n",
                std::stod(fa[2]), std::stod(fb[2]));
  EXPECT_NE(c.out.find(last), std::string::npos) << c.out;
  // No pair within --max-step-gap 0: losses only, exit 0, the header alone in compare.csv.
  const Cmd g = compare(s10 + " " + e4 + " --max-step-gap 0 -o " + csv.string());
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_NE(g.out.find("weights:     not compared: no checkpoint of 'e4' within --max-step-gap 0 "
                       "of one of 's10' (s10 has 5 10; e4 has 4 8 12); losses only\n"),
            std::string::npos) << g.out;
  EXPECT_TRUE(read_compare_csv(csv).empty());
  EXPECT_EQ(lines_of(slurp(out / "compare_loss.csv")).size(), 1u + 10 + 12);
}

// A run without checkpoints (here: its checkpoints removed) still compares its losses.
TEST(compare_Tool, RunWithoutCheckpointsComparesLosses) {
  const std::string a = train_run("a"), b = train_run("b");
  const fs::path bare = tmp_root() / "b_no_ckpt";
  fs::remove_all(bare);
  fs::create_directories(bare);
  fs::copy_file(fs::path(b) / "metrics.jsonl", bare / "metrics.jsonl");
  fs::copy_file(fs::path(b) / "config.yaml", bare / "config.yaml");
  const fs::path out = fresh_out_dir("no_ckpt");
  const fs::path csv = out / "compare.csv";
  const Cmd c = compare(a + " " + bare.string() + " -o " + csv.string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("losses identical (bitwise) at every shared step"), std::string::npos)
      << c.out;
  EXPECT_NE(c.out.find("weights:     not compared: run 'b_no_ckpt' has no checkpoint (no "
                       "ckpt_NNNNNNNN.bin in " + bare.string() + "); losses only\n"),
            std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("W1 aggregate"), std::string::npos) << c.out;
  EXPECT_TRUE(read_compare_csv(csv).empty());
  EXPECT_EQ(lines_of(slurp(out / "compare_loss.csv")).size(), 1u + 2 * 20);
  EXPECT_NE(c.out.find("wrote " + csv.string() + " (0 rows) and "), std::string::npos) << c.out;
  // As run A, too; and --step asks for weights: an error.
  const Cmd r = compare(bare.string() + " " + a + " -o " + csv.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("not compared: run 'b_no_ckpt' has no checkpoint"), std::string::npos)
      << r.out;
  const fs::path out2 = fresh_out_dir("no_ckpt_step");
  const Cmd s = compare(a + " " + bare.string() + " --step 10 -o " + (out2 / "c.csv").string());
  expect_one_line_error(s, out2);
  EXPECT_NE(s.err.find("has no checkpoint (no ckpt_NNNNNNNN.bin in " + bare.string()),
            std::string::npos) << s.err;
}

TEST(compare_Tool, CorruptOrTruncatedCheckpointNamesTheFile) {
  const std::string a = train_run("a"), b = train_run("b");
  const fs::path out = fresh_out_dir("corrupt");
  const fs::path bad = tmp_root() / "b_corrupt";
  fs::remove_all(bad);
  fs::copy(b, bad);
  const fs::path ck = bad / "ckpt_00000020.bin";
  std::string bytes = slurp(ck);
  ASSERT_GT(bytes.size(), 5000u);
  bytes[bytes.size() / 2] ^= 0x10;  // inside the master / moment arrays
  std::ofstream(ck, std::ios::binary | std::ios::trunc) << bytes;
  const Cmd c = compare(a + " " + bad.string() + " -o " + (out / "compare.csv").string());
  expect_one_line_error(c, out);
  EXPECT_NE(c.err.find(ck.string()), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("corrupt"), std::string::npos) << c.err;
  // Truncated.
  std::ofstream(ck, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 3);
  const Cmd t = compare(a + " " + bad.string() + " -o " + (out / "compare.csv").string());
  expect_one_line_error(t, out);
  EXPECT_NE(t.err.find(ck.string()), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("truncated"), std::string::npos) << t.err;
  // Step 10 is intact: --step 10 still works.
  const Cmd s = compare(a + " " + bad.string() + " --step 10 -o " + (out / "compare.csv").string());
  EXPECT_EQ(s.code, 0) << s.err;
}

TEST(compare_Tool, RunStillBeingWrittenIsReadAsFarAsComplete) {
  const std::string a = train_run("a"), b = train_run("b");
  const fs::path live = tmp_root() / "live";
  fs::remove_all(live);
  fs::copy(b, live);
  // A checkpoint being written (temporary name of io/checkpoint.cpp, half the bytes) and a
  // metrics line cut off mid-write.
  const std::string ck = slurp(fs::path(b) / "ckpt_00000020.bin");
  const size_t complete_lines = lines_of(slurp(live / "metrics.jsonl")).size();
  const fs::path tmp_ck = live / "ckpt_00000030.bin.tmp.4242";
  std::ofstream(tmp_ck, std::ios::binary) << ck.substr(0, ck.size() / 2);
  std::ofstream(live / "metrics.jsonl", std::ios::app) << "{\"step\":21,\"loss\":4.12";
  const fs::path out = fresh_out_dir("live");
  const Cmd c = compare(a + " " + live.string() + " -o " + (out / "compare.csv").string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("warning"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("metrics.jsonl line"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("ignoring " + tmp_ck.string()), std::string::npos) << c.err;
  EXPECT_NE(c.out.find("losses identical"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("compared: 10 20"), std::string::npos) << c.out;
  for (const auto& l : lines_of(slurp(out / "compare_loss.csv")))
    EXPECT_NE(l.rfind("21,", 0), 0u) << "the cut-off line was read: " << l;
  EXPECT_TRUE(fs::exists(tmp_ck)) << "the temporary file must be left alone";
  // A broken line that is not the last one is an error naming the file and line.
  std::ofstream(live / "metrics.jsonl", std::ios::app) << "\n{\"step\":22,\"loss\":4.1}\n";
  const fs::path out2 = fresh_out_dir("live2");
  const Cmd m = compare(a + " " + live.string() + " -o " + (out2 / "compare.csv").string());
  expect_one_line_error(m, out2);
  EXPECT_NE(m.err.find((live / "metrics.jsonl").string() + " line " +
                      std::to_string(complete_lines + 1) + ":"),
            std::string::npos)
      << m.err;
}

TEST(compare_Tool, UsageAndMissingInputs) {
  const std::string a = train_run("a");
  const fs::path out = fresh_out_dir("usage");
  const std::string o = " -o " + (out / "compare.csv").string();
  const Cmd one = compare(a + o);
  expect_one_line_error(one, out);
  EXPECT_NE(one.err.find("at least two"), std::string::npos) << one.err;
  const Cmd none = compare(o);
  expect_one_line_error(none, out);
  const Cmd missing = compare(a + " " + (tmp_root() / "no_such_run").string() + o);
  expect_one_line_error(missing, out);
  EXPECT_NE(missing.err.find("no_such_run"), std::string::npos) << missing.err;
  const fs::path empty = tmp_root() / "empty_run";
  fs::create_directories(empty);
  const Cmd nom = compare(a + " " + empty.string() + o);
  expect_one_line_error(nom, out);
  EXPECT_NE(nom.err.find((empty / "metrics.jsonl").string()), std::string::npos) << nom.err;
  const Cmd mixed = compare(a + " " + a + "/ckpt_00000010.bin" + o);
  expect_one_line_error(mixed, out);
  const Cmd badopt = compare(a + " " + a + " --top many" + o);
  expect_one_line_error(badopt, out);
  EXPECT_NE(badopt.err.find("--top"), std::string::npos) << badopt.err;
}

// Issue 19: a directory named metrics.jsonl was read as an empty file (no losses, exit 0);
// a directory named config.yaml or ckpt_NNNNNNNN.bin went on to a confusing read error.
// Each is a one-line error naming the path, and nothing is written.
TEST(compare_Tool, NonRegularInputFilesAreRefused) {
  const std::string a = train_run("a"), b = train_run("b");
  for (const char* f : {"metrics.jsonl", "config.yaml", "ckpt_00000010.bin"}) {
    const fs::path out = fresh_out_dir(std::string("nonreg_") + f);
    const fs::path bad = tmp_root() / (std::string("b_nonreg_") + f);
    fs::remove_all(bad);
    fs::copy(b, bad);
    fs::remove(bad / f);
    fs::create_directories(bad / f / "x");
    const Cmd c = compare(a + " " + bad.string() + " -o " + (out / "compare.csv").string());
    expect_one_line_error(c, out);
    EXPECT_NE(c.err.find((bad / f).string() + " is not a regular file"), std::string::npos)
        << f << ": " << c.err;
  }
}

// Issue 19: a metrics.jsonl value quoted in an error was echoed whole (a 5000-character
// string, escapes and all). It is a short excerpt now; a binary line is escaped.
TEST(compare_Tool, QuotedMetricsContentIsShortAndPrintable) {
  const std::string a = train_run("a"), b = train_run("b");
  const fs::path bad = tmp_root() / "b_long_value";
  fs::remove_all(bad);
  fs::copy(b, bad);
  std::ofstream(bad / "metrics.jsonl", std::ios::app)
      << "{\"step\":21,\"loss\":\"" << std::string(5000, 'q') << "\"}\n";
  const fs::path out = fresh_out_dir("long_value");
  const Cmd c = compare(a + " " + bad.string() + " -o " + (out / "compare.csv").string());
  expect_one_line_error(c, out);
  EXPECT_NE(c.err.find("\"loss\" is not a number (\"qqq"), std::string::npos) << c.err;
  EXPECT_LT(c.err.size(), 400u) << c.err;
  // A line of binary bytes that is not the last: quoted escaped.
  std::ofstream(bad / "metrics.jsonl", std::ios::trunc | std::ios::binary)
      << std::string("\x01\xfe\xff garbage\n") << slurp(fs::path(b) / "metrics.jsonl");
  const Cmd m = compare(a + " " + bad.string() + " -o " + (out / "compare.csv").string());
  expect_one_line_error(m, out);
  EXPECT_NE(m.err.find("'\\x01\\xfe\\xff garbage'"), std::string::npos) << m.err;
  for (char ch : m.err) EXPECT_TRUE(ch == '\n' || (ch >= 0x20 && ch < 0x7f)) << m.err;
}
