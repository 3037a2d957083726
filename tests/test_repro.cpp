// The reproduction study's tools (docs/reproduction.md): apps/repro_summary.py against run
// folders whose answers are known (label cpu), and the smoke version of the study end to end
// with every figure of its table re-derived here from the run files (label slow).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using st::test::slurp;

namespace {

const fs::path& tmp_root() { return st::test::scratch_root("st_repro_test_"); }

using st::test::Cmd;
Cmd run_cmd(const std::string& cmd) { return st::test::run_cmd(cmd, tmp_root()); }

// repro_summary.py over `dirs`; its JSON (one object per run, by run name).
std::map<std::string, json> summary(const std::string& dirs, std::string* table = nullptr) {
  const fs::path js = tmp_root() / "summary.json";
  const Cmd c = run_cmd("python3 " ST_SOURCE_DIR "/apps/repro_summary.py " + dirs + " --json " + js.string());
  EXPECT_EQ(c.code, 0) << c.err;
  if (table) *table = c.out;
  std::map<std::string, json> m;
  for (const json& r : json::parse(slurp(js))) m[r["run"].get<std::string>()] = r;
  return m;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// A run folder with known answers: losses 3 - 0.001 s until `jump` (0: never), 4.5 after;
// W_Q of L0H0 grows from 0.5 to 1.5 (x3), every other slice stays at 1; head 0's delta
// drift is positive on all 5 hook steps, head 1's alternates, every delta_abs_err 2e-6;
// tied_row_frac 0.1 and 0.3.
// folder, seed and backend place it in a study of several configurations.
fs::path known_run(const std::string& name, int steps, int jump, const std::string& log_line,
                   const std::string& folder = "known", int seed = 5,
                   const std::string& backend = "flash") {
  const fs::path d = tmp_root() / folder / name;
  write(d / "config.yaml", "run:\n  name: " + name + "\n  seed: " + std::to_string(seed) +
                               "   # seed\ntrain:\n  max_steps: 300\nattention:\n  backend: " +
                               backend + "\n");
  std::ostringstream m;
  for (int s = 1; s <= steps; ++s)
    m << json{{"kind", "train"}, {"step", s}, {"loss", jump && s >= jump ? 4.5 : 3.0 - 0.001 * s},
              {"grad_norm", 0.5 + 0.01 * s}}.dump() << "\n";
  m << json{{"kind", "eval"}, {"step", steps}, {"val_loss", 2.25}}.dump() << "\n";
  write(d / "metrics.jsonl", m.str());
  std::ostringstream sp;
  sp << "step,layer,head,matrix,sigma,iters,converged\n";
  for (int s : {0, 50, 100})
    for (int h = 0; h < 2; ++h)
      for (const char* mat : {"wq", "wk"})
        sp << s << ",0," << h << "," << mat << ","
           << (h == 0 && std::string(mat) == "wq" ? 0.5 + s / 100.0 : 1.0) << ",5,1\n";
  sp << "100,0,-1,qkvw,50.0,5,1\n";  // a per-layer matrix: not a head slice, not counted
  write(d / "spectral.csv", sp.str());
  std::ostringstream dd;
  dd << "step,layer,head,delta_drift,delta_drift_cum,delta_abs_err,dwq_err_norm,dwq_rel_err,dwq_cos_prev\n";
  for (int k = 1; k <= 5; ++k) {
    dd << k * 20 << ",0,0," << 1e-6 * k << ",0,2e-6,0,0,\n";
    dd << k * 20 << ",0,1," << (k % 2 ? 1e-6 : -1e-6) << ",0,2e-6,0,0,\n";
  }
  write(d / "delta_drift.csv", dd.str());
  write(d / "attn_stats.csv", "step,layer,head,stat,value\n20,0,0,tied_row_frac,0.1\n40,0,0,tied_row_frac,0.1\n"
                              "20,0,1,tied_row_frac,0.3\n20,0,1,max_logit,7\n");
  write(d / "events.jsonl", "{\"step\":40,\"event\":\"spike\",\"metric\":\"loss\"}\n"
                            "{\"step\":40,\"event\":\"spike\",\"metric\":\"grad_norm\"}\n"
                            "{\"step\":90,\"event\":\"spike\",\"metric\":\"loss\"}\n");
  write(d / "train.log", log_line + "\n");
  return d;
}

}  // namespace

TEST(ReproSummary, FiguresOfRunsWithKnownAnswers) {
  known_run("calm", 300, 0, "[t] done");
  known_run("exploding", 300, 137, "[t] done");
  known_run("nan", 120, 0,
            "[t] train: error: step 121: the training loss is nan; stopping (last good checkpoint: x)");
  std::string table;
  auto s = summary((tmp_root() / "known").string(), &table);
  ASSERT_EQ(s.size(), 3u) << table;

  const json& calm = s.at("calm");
  EXPECT_TRUE(calm["explosion"].is_null()) << calm.dump();
  EXPECT_EQ(calm["steps"], 300);
  EXPECT_EQ(calm["spikes"], 2);  // steps 40 and 90: one spike step flagged twice counts once
  // The last 50 losses: steps 251..300, 3 - 0.001 s: mean 3 - 0.2755.
  EXPECT_NEAR(calm["final_loss"].get<double>(), 3.0 - 0.2755, 1e-12);
  EXPECT_EQ(calm["val_loss"], 2.25);
  // Gradient norms 0.5 + 0.01 s: the last 50 (steps 251..300) average 0.5 + 2.755.
  EXPECT_NEAR(calm["final_grad_norm"].get<double>(), 0.5 + 2.755, 1e-12);
  EXPECT_NEAR(calm["sigma_growth"].get<double>(), 3.0, 1e-12);
  EXPECT_EQ(calm["sigma_where"], "wq L0H0");
  EXPECT_NEAR(calm["one_signed"].get<double>(), 1.0, 1e-12);  // head 0: five positive steps
  EXPECT_EQ(calm["one_signed_sign"], 1);
  EXPECT_EQ(calm["pos_steps"], "5/5");
  EXPECT_NEAR(calm["sign_p"].get<double>(), 2.0 / 32.0, 1e-12);
  EXPECT_NEAR(calm["one_signed_median"].get<double>(), (1.0 + 0.2) / 2, 1e-12);  // head 1: |1e-6| / 5e-6
  EXPECT_NEAR(calm["pos_frac"].get<double>(), 8.0 / 10.0, 1e-12);  // 5 of head 0, 3 of head 1
  EXPECT_NEAR(calm["abs_err"].get<double>(), 2e-6, 1e-18);
  EXPECT_NEAR(calm["net_drift"].get<double>(), (15e-6 + 1e-6) / (10 * 2e-6), 1e-12);  // sum drift / sum |err|
  EXPECT_NEAR(calm["ties_mean"].get<double>(), 0.2, 1e-12);
  EXPECT_NEAR(calm["ties_max"].get<double>(), 0.3, 1e-12);

  // The explosion step: the first 20-step mean 0.5 nats above the lowest earlier one,
  // recomputed here from the losses the run was given.
  const json& ex = s.at("exploding");
  double best = 1e9;
  int expect = 0;
  for (int end = 20; end <= 300 && !expect; ++end) {
    double m = 0;
    for (int t = end - 19; t <= end; ++t) m += (t >= 137 ? 4.5 : 3.0 - 0.001 * t) / 20;
    if (m >= best + 0.5) expect = end;
    best = std::min(best, m);
  }
  ASSERT_GT(expect, 137);
  EXPECT_EQ(ex["explosion"], expect);

  // A run train stopped on a non-finite loss explodes at the step after its last logged one.
  const json& nan = s.at("nan");
  EXPECT_EQ(nan["explosion"], 121);
  EXPECT_NE(nan["stopped"].get<std::string>().find("the training loss is nan"), std::string::npos);
  EXPECT_NE(table.find("| nan | 5 | 120 of 300 | 121 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| calm | 5 | 300 | none | 2 | 2.724 | 2.250 | 3.25 | 3.00 (wq L0H0) |"),
            std::string::npos) << table;
}

TEST(ReproSummary, ExplosionTableAndTimelineWithKnownAnswers) {
  // Two configurations of three seeds: flash explodes in seeds 1 and 2, stabilized_flash in
  // none. Seed 1 jumps to 4.5 at step 137: the lowest 20-step mean before is 2.8735 (steps
  // 117-136); the window ending at 142 (six steps at 4.5) averages 3.3594, the one ending at
  // 143 (seven) 3.4405 >= 2.8735 + 0.5: step 143. Seed 2's loss is non-finite after step 120.
  known_run("f1", 300, 137, "[t] done", "known2", 1, "flash");
  known_run("f2", 120, 0, "[t] train: error: step 121: the training loss is nan; stopping", "known2", 2, "flash");
  known_run("f3", 300, 0, "[t] done", "known2", 3, "flash");
  for (int seed = 1; seed <= 3; ++seed)
    known_run("s" + std::to_string(seed), 300, 0, "[t] done", "known2", seed, "stabilized_flash");
  const std::string dir = (tmp_root() / "known2").string();
  const Cmd c = run_cmd("python3 " ST_SOURCE_DIR "/apps/repro_summary.py " + dir +
                        " --explosions --reference stabilized --timeline 1");
  ASSERT_EQ(c.code, 0) << c.err;
  // 2 of 3: the exact 95% interval is [0.0943, 0.9916] (beta quantiles); 0 of 3: [0, 0.7076].
  // Fisher, margins 3/3 and 2 exploded: P(2) = P(0) = 3/15, P(1) = 9/15; two-sided p = 0.4.
  EXPECT_NE(c.out.find("| flash | 1: 143, 2: 121, 3: none | 2 of 3 | 0.09-0.99 | 0.4 |"),
            std::string::npos) << c.out;
  EXPECT_NE(c.out.find("| stabilized_flash | 1: none, 2: none, 3: none | 0 of 3 | 0.00-0.71 | - |"),
            std::string::npos) << c.out;
  // The timeline of f3 at hook step 40: gradient norms 0.5 + 0.01 s over steps 21..40 average
  // 0.805; ties at 40: head 0's 0.1 (the only head logged there); sigma of W_Q L0H0 is logged at
  // steps 0, 50, 100 only ("-"); head 0's delta drift 1e-6 + 2e-6 summed by step 40.
  EXPECT_NE(c.out.find("**f3** (seed 3; explosion: none; top head W_Q L0H0)"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find(" | 0.805 | 0.1000 | - | 3.00e-06 |"), std::string::npos) << c.out;
  // A key some runs' config.yaml lacks (written by a newer train) does not split a
  // configuration when the runs that have it agree.
  {
    std::ofstream(tmp_root() / "known2" / "f3" / "config.yaml", std::ios::app)
        << "  o_tilde_gain: 0.0\n";
    const Cmd newer = run_cmd("python3 " ST_SOURCE_DIR "/apps/repro_summary.py " + dir +
                              " --explosions --reference stabilized");
    EXPECT_EQ(newer.code, 0) << newer.err;
    EXPECT_NE(newer.out.find("| flash | 1: 143, 2: 121, 3: none | 2 of 3 |"), std::string::npos)
        << newer.out;
  }
  // Same drift files in every run: net 0.8 and drift > 0 0.8 in both, permutation p = 1.
  EXPECT_NE(c.out.find("| 0.4 | 0.8000 ± 0.0000 | 1 | 0.800 ± 0.000 | 1 |"), std::string::npos) << c.out;
  // The permutation test's known answers: {1,2,3} vs {4,5,6}, 2 of the 20 splits as far apart
  // (itself and its mirror); {1,2,4} vs {3,5,6}, sum 7 of 21: the splits summing <= 7 or >= 14,
  // {1,2,3} {1,2,4} {3,5,6} {4,5,6}: 4 of 20.
  const Cmd perm = run_cmd("python3 -c \"import sys; sys.path.insert(0, '" ST_SOURCE_DIR "/apps'); "
                           "import repro_summary as r; print(r.permutation_p([1, 2, 3], [4, 5, 6]), "
                           "r.permutation_p([1, 2, 4], [3, 5, 6]))\"");
  EXPECT_EQ(perm.out, "0.1 0.2\n") << perm.err;
  // A label matched exactly wins over the labels it is a substring of ("flash" of
  // "stabilized_flash"); a substring of two labels, or of none, is a one-line error.
  const Cmd exact = run_cmd("python3 " ST_SOURCE_DIR "/apps/repro_summary.py " + dir +
                            " --explosions --reference flash");
  EXPECT_EQ(exact.code, 0) << exact.err;
  EXPECT_NE(exact.out.find("| stabilized_flash | 1: none, 2: none, 3: none | 0 of 3 | 0.00-0.71 | 0.4 |"),
            std::string::npos) << exact.out;
  const Cmd bad = run_cmd("python3 " ST_SOURCE_DIR "/apps/repro_summary.py " + dir +
                          " --explosions --reference las");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--reference 'las' matches 2 configurations"), std::string::npos) << bad.err;
}

TEST(ReproSummary, NoRunsIsAOneLineError) {
  fs::create_directories(tmp_root() / "empty");
  const Cmd c = run_cmd("python3 " ST_SOURCE_DIR "/apps/repro_summary.py " + (tmp_root() / "empty").string());
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.err.find("repro_summary: error: no run folders"), std::string::npos) << c.err;
  const Cmd d = run_cmd("python3 " ST_SOURCE_DIR "/apps/repro_summary.py " + (tmp_root() / "absent").string());
  EXPECT_NE(d.code, 0);
  EXPECT_NE(d.err.find("no such folder"), std::string::npos) << d.err;
}

// Every study file of the reproduction passes study's checks (a dry run from the repository
// root): the headline, its smoke version, the 124M GPU protocol, the one-call 124M study and
// the search rounds.
TEST(ReproStudy, ShippedStudyFilesPassTheirChecks) {
  std::vector<std::string> files = {"configs/studies/repro_tiny.yaml", "configs/studies/repro_tiny_smoke.yaml",
                                    "configs/studies/repro_gpt2_small.yaml",
                                    "configs/studies/gpt2_small_one_call.yaml"};
  for (const auto& e : fs::directory_iterator(ST_SOURCE_DIR "/configs/studies/repro_search"))
    files.push_back("configs/studies/repro_search/" + e.path().filename().string());
  ASSERT_GE(files.size(), 5u);
  for (const auto& f : files) {
    const fs::path out = tmp_root() / "dry" / fs::path(f).stem();
    const Cmd c = run_cmd("cd " ST_SOURCE_DIR " && " ST_STUDY_BIN " " + f + " --dry-run --out " + out.string());
    EXPECT_EQ(c.code, 0) << f << ": " << c.err;
    EXPECT_NE(c.out.find("study: dry run: nothing run, nothing written"), std::string::npos) << f << c.out;
    EXPECT_FALSE(fs::exists(out)) << f;
  }
}

// The smoke study is the headline study with fewer steps: the same file once the header
// comment, out_dir, checkpoints and the lines marked "# smoke" are left out.
TEST(ReproStudy, SmokeStudyIsTheHeadlineWithFewerSteps) {
  const auto body = [](const std::string& path) {
    std::istringstream in(slurp(ST_SOURCE_DIR "/" + path));
    std::string out, line;
    bool started = false;
    while (std::getline(in, line)) {
      started = started || line.rfind("base:", 0) == 0;
      if (!started || line.rfind("out_dir:", 0) == 0 || line.rfind("checkpoints:", 0) == 0 ||
          line.find("# smoke") != std::string::npos || line.rfind("report:", 0) == 0)
        continue;
      out += line.substr(0, line.find("   #")) + "\n";
    }
    return out;
  };
  const std::string head = body("configs/studies/repro_tiny.yaml");
  ASSERT_NE(head.find("runs:"), std::string::npos);
  EXPECT_EQ(body("configs/studies/repro_tiny_smoke.yaml"), head);
}

// The smoke study (configs/studies/repro_tiny_smoke.yaml: the headline study's runs, 40 steps
// each) end to end, and each figure of the summary re-derived from the run files here.
TEST(ReproStudySlow, SmokeStudyAndItsTableFromTheRunFiles) {
  const fs::path out = tmp_root() / "smoke";
  const Cmd c = run_cmd("cd " ST_SOURCE_DIR " && " ST_STUDY_BIN " configs/studies/repro_tiny_smoke.yaml --out " +
                        out.string());
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  auto s = summary(out.string());
  ASSERT_EQ(s.size(), 12u);
  int flash = 0;
  for (const auto& [name, r] : s) {
    const fs::path d = out / name;
    // Final loss: the mean of the last 50 training losses of metrics.jsonl.
    std::vector<double> loss;
    std::ifstream m(d / "metrics.jsonl");
    for (std::string line; std::getline(m, line);) {
      const json j = json::parse(line);
      if (j["kind"] == "train") loss.push_back(j["loss"].get<double>());
    }
    ASSERT_EQ(static_cast<int>(loss.size()), r["max_steps"].get<int>()) << name;
    EXPECT_EQ(r["steps"], static_cast<int>(loss.size()));
    double tail = 0;
    const size_t n = std::min<size_t>(50, loss.size());
    for (size_t i = loss.size() - n; i < loss.size(); ++i) tail += loss[i] / n;
    EXPECT_NEAR(r["final_loss"].get<double>(), tail, 1e-12 * tail) << name;
    // Sigma growth: the largest last/first ratio of a W_Q or W_K head slice in spectral.csv.
    std::map<std::string, std::pair<double, double>> first_last;
    std::ifstream sp(d / "spectral.csv");
    std::string line;
    std::getline(sp, line);
    while (std::getline(sp, line)) {
      std::vector<std::string> f;
      std::stringstream ss(line);
      for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
      if (f[3] != "wq" && f[3] != "wk") continue;
      auto& fl = first_last[f[1] + "." + f[2] + "." + f[3]];
      if (f[0] == "0") fl.first = std::stod(f[4]);
      fl.second = std::stod(f[4]);  // rows are in step order
    }
    double g = 0;
    for (const auto& [k, fl] : first_last) g = std::max(g, fl.second / fl.first);
    EXPECT_NEAR(r["sigma_growth"].get<double>(), g, 1e-12 * g) << name;
    EXPECT_GT(r["hook_steps"].get<int>(), 1) << name;
    EXPECT_GE(r["ties_mean"].get<double>(), 0.0) << name;
    flash += name.find("flash") != std::string::npos;
  }
  EXPECT_EQ(flash, 9);  // flash and stabilized flash x 3 seeds, and the FP32 flash control x 3
  EXPECT_TRUE(fs::exists(out / "report.html"));
  EXPECT_TRUE(fs::exists(out / "compare.csv"));
}
