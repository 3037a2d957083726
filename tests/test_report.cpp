// `report` end to end: two real tiny runs from the `train` binary (metrics.jsonl,
// checkpoints) plus hook files written here with values chosen to be checked
// (spectral.csv, attn_stats.csv, delta_drift.csv, events.jsonl); the --text table's order
// and growth figures, robust CSV reading, the page's data document against the run files
// (Δloss exactly, weight distances between checkpoints, the reference chosen on the command
// line), the page rendered by headless Chromium (no console output, every panel with its
// expected number of series, a screenshot under the build folder's test_artifacts/),
// --watch, and that nothing but the -o file is written. (Bad input and a real run with
// hooks: test_report_bad_input.cpp; the shared harness: report_fixture.h.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "report_fixture.h"
#include "report_page.h"
#include "apps/report/html_report.h"
#include "apps/report/run_data.h"

using namespace st::report_test;

// ---------------------------------------------------------------- --text

TEST(ReportText, LargestHeadsFirstWithGrowth) {
  const Cmd r = report("--text " + q(run_a()));
  ASSERT_EQ(r.code, 0) << r.err;
  std::printf("%s", r.out.c_str());
  const auto rows = table_after(r.out, "wq per head");
  ASSERT_EQ(rows.size(), 4u) << r.out;
  // layer, head, sigma first, sigma last, growth; largest last sigma first.
  EXPECT_EQ(rows[0], (std::vector<std::string>{"1", "1", "1", "4", "4.000"}));
  EXPECT_EQ(rows[1], (std::vector<std::string>{"1", "0", "3", "3.3", "1.100"}));
  EXPECT_EQ(rows[2], (std::vector<std::string>{"0", "0", "2", "2.5", "1.250"}));
  EXPECT_EQ(rows[3], (std::vector<std::string>{"0", "1", "1.5", "1.5", "1.000"}));
  EXPECT_NE(r.out.find("sigma@0"), std::string::npos);
  EXPECT_NE(r.out.find("sigma@20"), std::string::npos);
  // The half-written last line (L0 H1 sigma 99) is not in the table (rows[3] above), and
  // the skip is said.
  EXPECT_NE(r.out.find("incomplete last line"), std::string::npos) << r.out;
  // Per-layer matrices: every (matrix, layer) once, embeddings without a layer.
  const auto layers = table_after(r.out, "per-layer matrices");
  ASSERT_EQ(layers.size(), 10u) << r.out;
  EXPECT_EQ(layers[0], (std::vector<std::string>{"qkvw", "0", "2", "2.2", "1.100"}));
  EXPECT_EQ(layers[8], (std::vector<std::string>{"wte", "-", "4", "5", "1.250"}));
  // Columns line up: every row of a table has the same length.
  std::istringstream in(r.out);
  std::map<size_t, size_t> lengths;
  bool in_wq = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("wq per head", 0) == 0) in_wq = true;
    else if (line.empty()) in_wq = false;
    else if (in_wq) ++lengths[line.size()];
  }
  EXPECT_EQ(lengths.size(), 1u) << "ragged columns:\n" << r.out;
}

TEST(ReportText, OtherMatrixAndTop) {
  const Cmd r = report("--text --matrix wk --top 1 " + q(run_a()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = table_after(r.out, "wk per head");
  ASSERT_EQ(rows.size(), 1u) << r.out;
  EXPECT_EQ(rows[0], (std::vector<std::string>{"0", "1", "2.5", "5", "2.000"}));
  EXPECT_NE(r.out.find("top 1 of 4"), std::string::npos) << r.out;
  const Cmd bad = report("--text --matrix wz " + q(run_a()));
  EXPECT_NE(bad.code, 0);
}

TEST(ReportText, RunWithoutSpectralIsAnError) {
  const Cmd r = report("--text " + q(run_b()));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(run_b().string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no spectral.csv: the run had hooks.every: 0"), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
}

// ---------------------------------------------------------------- CSV reading

TEST(ReportCsv, HeaderDrivenEmptyFieldsAndIncompleteLines) {
  const fs::path d = tmp_root() / "csv";
  fs::create_directories(d);
  const fs::path p = d / "spectral.csv";
  // Columns in another order, CRLF line ends, an empty head / layer, and a last line
  // without its newline (skipped: the run is still writing).
  std::ofstream(p, std::ios::binary) << "matrix,sigma,step,head,layer,iters,converged\r\n"
                                        "wq,1.5,5,1,0,3,1\r\n"
                                        "wte,2.5,5,,,3,1\r\n"
                                        "wq,7,10,1,0,3,1";
  const st::report::CsvTable t = st::report::read_csv(p.string());
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.skipped_bad, 0u);
  EXPECT_EQ(t.skipped_incomplete, 1u);
  EXPECT_EQ(t.col("layer"), 4);
  EXPECT_EQ(t.rows[1][t.col("matrix")], "wte");
  EXPECT_EQ(st::report::to_index(t.rows[1][t.col("layer")]), -1);
  EXPECT_EQ(st::report::to_index(t.rows[0][t.col("head")]), 1);
  EXPECT_EQ(st::report::to_index("-1"), -1);
  EXPECT_TRUE(std::isnan(st::report::to_num("")));
  EXPECT_TRUE(std::isnan(st::report::to_num("1.5x")));
  EXPECT_EQ(st::report::to_num("2.5e-3"), 2.5e-3);
  EXPECT_THROW(st::report::read_csv((d / "absent.csv").string()), std::exception);

  // The same file in a run directory goes through `report --text` the same way.
  fs::copy_file(run_b() / "metrics.jsonl", d / "metrics.jsonl", fs::copy_options::overwrite_existing);
  const Cmd r = report("--text " + q(d));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = table_after(r.out, "wq per head");
  ASSERT_EQ(rows.size(), 1u) << r.out;
  EXPECT_EQ(rows[0], (std::vector<std::string>{"0", "1", "1.5", "1.5", "1.000"}));
  EXPECT_NE(r.out.find("skipped an incomplete last line"), std::string::npos) << r.out;

  // A complete line with too few fields is no longer skipped in silence: file:line.
  const fs::path shortp = d / "short.csv";
  std::ofstream(shortp, std::ios::binary) << "step,layer,head,matrix,sigma\nwq,1.5,5\n";
  try {
    st::report::read_csv(shortp.string());
    ADD_FAILURE() << "a 3-field line under a 5-column header was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("short.csv:2: 3 fields"), std::string::npos) << e.what();
  }
}

// The hooks write -1 for "not per layer / head"; files written before that have empty
// fields. Both load to the same rows.
TEST(ReportCsv, MinusOneAndEmptyLayerHeadLoadAlike) {
  std::vector<st::report::SpectralRow> rows[2];
  for (int k = 0; k < 2; ++k) {
    const fs::path d = tmp_root() / (k == 0 ? "none_minus_one" : "none_empty");
    fs::remove_all(d);
    fs::create_directories(d);
    for (const char* f : {"metrics.jsonl", "config.yaml"}) fs::copy_file(run_b() / f, d / f);
    write_hook_files(d, false, k == 0 ? "-1" : "");
    EXPECT_EQ(slurp(d / "spectral.csv").find(",-1,") != std::string::npos, k == 0);
    rows[k] = st::report::load_run(d.string()).spectral;
  }
  ASSERT_EQ(rows[0].size(), rows[1].size());
  size_t whole = 0, per_layer = 0;
  for (size_t i = 0; i < rows[0].size(); ++i) {
    const auto &a = rows[0][i], &b = rows[1][i];
    EXPECT_EQ(std::tie(a.step, a.layer, a.head, a.matrix, a.sigma),
              std::tie(b.step, b.layer, b.head, b.matrix, b.sigma)) << i;
    whole += a.layer == -1 && a.head == -1;
    per_layer += a.layer >= 0 && a.head == -1;
  }
  EXPECT_EQ(whole, 10u);      // wte, wpe at 5 steps
  EXPECT_EQ(per_layer, 40u);  // 4 matrices x 2 layers at 5 steps
}

// ---------------------------------------------------------------- HTML

namespace {

// Loss per step of a run's metrics.jsonl (training lines), read here independently.
std::map<int64_t, double> losses(const fs::path& dir, const char* key) {
  std::map<int64_t, double> m;
  std::istringstream in(slurp(dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains(key) && j.contains("step")) m[j["step"].get<int64_t>()] = j[key].get<double>();
  }
  return m;
}

fs::path html_ab() {
  static const fs::path out = [] {
    const fs::path o = tmp_root() / "ab.html";
    const Cmd r = report(q(run_a()) + " " + q(run_b()) + " -o " + q(o));
    EXPECT_EQ(r.code, 0) << r.err;
    return o;
  }();
  return out;
}

}  // namespace

TEST(ReportHtml, DataDocumentAgainstTheRunFiles) {
  const auto before_a = snapshot(run_a()), before_b = snapshot(run_b());
  const Cmd r = report(q(run_a()) + " " + q(run_b()) + " -o " + q(tmp_root() / "sections.html"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("reference run_a"), std::string::npos) << r.out;
  const std::string html = slurp(tmp_root() / "sections.html");
  // Nothing in the runs was written or removed.
  EXPECT_EQ(before_a, snapshot(run_a()));
  EXPECT_EQ(before_b, snapshot(run_b()));
  // One offline file: the only scripts are inline, nothing is fetched.
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("url(http"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_NE(html.find("uPlot"), std::string::npos) << "the chart library is not inlined";

  const nlohmann::json d = page_data(html);
  ASSERT_TRUE(d.is_object()) << "no report-data document";
  EXPECT_EQ(d["reference"], 0);
  ASSERT_EQ(d["runs"].size(), 2u);
  const auto& a = d["runs"][0];
  const auto& b = d["runs"][1];
  EXPECT_EQ(a["name"], "run_a");
  EXPECT_EQ(b["name"], "run_b");
  EXPECT_EQ(a["config"]["precision.compute"], "bf16");
  EXPECT_EQ(b["config"]["precision.compute"], "fp32");
  EXPECT_EQ(a["config"]["attention.o_tilde_bits"], "3");
  EXPECT_EQ(b["config"]["attention.o_tilde_bits"], "0");  // the default: O~ not narrowed
  EXPECT_EQ(a["shape"], "2L · 2H · 32C · T 32 · V 256");
  // Run B has no hook files: the note says why.
  EXPECT_EQ(b["files"]["spectral"]["note"], "no spectral.csv: the run had hooks.every: 0");
  EXPECT_EQ(b["files"]["attn"]["note"], "no attn_stats.csv: the run had hooks.every: 0");
  EXPECT_EQ(a["files"]["spectral"]["note"], "spectral.csv: skipped an incomplete last line (the run is still writing)");
  // The loss of every step, and Δloss = B - A at every step, exactly, against the files.
  const auto la = losses(run_a(), "loss"), lb = losses(run_b(), "loss");
  ASSERT_EQ(a["train"]["step"].size(), la.size());
  ASSERT_EQ(b["dloss"]["step"].size(), lb.size());
  for (size_t i = 0; i < b["dloss"]["step"].size(); ++i) {
    const int64_t s = b["dloss"]["step"][i];
    EXPECT_EQ(b["dloss"]["y"][i].get<double>(), lb.at(s) - la.at(s)) << "step " << s;
  }
  EXPECT_FALSE(a.contains("dloss")) << "the reference has no Δloss against itself";
  const auto va = losses(run_a(), "val_loss"), vb = losses(run_b(), "val_loss");
  ASSERT_EQ(b["dval"]["step"].size(), vb.size());
  for (size_t i = 0; i < vb.size(); ++i) {
    const int64_t s = b["dval"]["step"][i];
    EXPECT_EQ(b["dval"]["y"][i].get<double>(), vb.at(s) - va.at(s));
  }
  // The hook files' values, per matrix / stat / field and (layer, head).
  bool seen_l1h1 = false;
  for (const auto& x : a["spectral"])
    if (x["m"] == "wq" && x["l"] == 1 && x["h"] == 1) {
      seen_l1h1 = true;
      EXPECT_EQ(x["x"], nlohmann::json({0, 5, 10, 15, 20}));
      EXPECT_EQ(x["y"].front(), 1.0);
      EXPECT_EQ(x["y"].back(), 4.0);
    }
  EXPECT_TRUE(seen_l1h1);
  EXPECT_EQ(a["spectral"].size(), 2u + 2 * 4 + 2 * 2 * 4);  // wte wpe, per layer 4, per head 4
  EXPECT_EQ(a["attn"].size(), 6u * 2 * 2);
  EXPECT_EQ(a["drift"].size(), 4u * 2 * 2);
  for (const auto& x : a["drift"]) {
    if (x["f"] == "delta_drift_cum" && x["l"] == 1 && x["h"] == 1) {
      EXPECT_NEAR(x["y"].back().get<double>(), 4e-7, 1e-20);
    }
  }
  ASSERT_EQ(a["events"].size(), 1u);
  EXPECT_EQ(a["events"][0]["text"], "run_a: spike in loss at step 12: 6.5 (mean 4.9 ± 0.1), z 16, action: snapshot");
  // Weight distances of B against A from the checkpoints of steps 10 and 20.
  ASSERT_EQ(d["distance"].size(), 1u);
  const auto& w = d["distance"][0];
  EXPECT_EQ(w["run"], 1);
  EXPECT_EQ(w["against"], 0);
  EXPECT_EQ(w["pairs"], nlohmann::json::parse(R"([{"a":10,"b":10},{"a":20,"b":20}])"));
  EXPECT_NE(w["pairing"].get<std::string>().find("the same step in both runs"), std::string::npos) << w["pairing"];
  size_t positive = 0;
  for (const auto& x : w["series"]) {
    EXPECT_EQ(x["x"], nlohmann::json({10, 20}));
    for (const auto& v : x["max"]) positive += v.is_number() && v.get<double>() > 0;
  }
  EXPECT_GT(positive, 10u) << "bf16 and fp32 runs of other seeds have the same weights?";
}

TEST(ReportHtml, ReferenceOnTheCommandLine) {
  const fs::path out = tmp_root() / "ref_b.html";
  for (const std::string& ref : {q(run_b()), std::string("run_b")}) {
    const Cmd r = report(q(run_a()) + " " + q(run_b()) + " --reference " + ref + " -o " + q(out));
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json d = page_data(slurp(out));
    EXPECT_EQ(d["reference"], 1);
    EXPECT_TRUE(d["runs"][0].contains("dloss"));
    EXPECT_FALSE(d["runs"][1].contains("dloss"));
    EXPECT_EQ(d["distance"][0]["run"], 0);
    EXPECT_EQ(d["distance"][0]["against"], 1);
  }
  const Cmd bad = report(q(run_a()) + " " + q(run_b()) + " --reference run_z -o " + q(out));
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("--reference 'run_z' is none of the runs given"), std::string::npos) << bad.err;
  EXPECT_EQ(count(bad.err, "\n"), 1u) << bad.err;
}

TEST(ReportHtml, CheckpointPairsExactElseNearest) {
  using st::report::checkpoint_pairs;
  auto steps = [](std::initializer_list<int64_t> s) {
    std::map<int64_t, std::string> m;
    for (int64_t x : s) m[x] = "f";
    return m;
  };
  auto flat = [](const std::vector<st::report::CheckpointPair>& v) {
    std::vector<std::pair<int64_t, int64_t>> o;
    for (const auto& p : v) o.emplace_back(p.step_a, p.step_b);
    return o;
  };
  using V = std::vector<std::pair<int64_t, int64_t>>;
  // Each of A's steps with B's same step, else B's nearest (the earlier on a tie).
  EXPECT_EQ(flat(checkpoint_pairs(steps({10, 20, 30}), steps({20, 30, 40}), 0)), (V{{10, 20}, {20, 20}, {30, 30}}));
  EXPECT_EQ(flat(checkpoint_pairs(steps({10, 20, 30}), steps({15, 24, 99}), 0)), (V{{10, 15}, {20, 24}, {30, 24}}));
  EXPECT_EQ(flat(checkpoint_pairs(steps({15}), steps({10, 20}), 0)), (V{{15, 10}}));
  EXPECT_EQ(flat(checkpoint_pairs(steps({5, 60}), steps({50}), 0)), (V{{5, 50}, {60, 50}}));
  EXPECT_TRUE(checkpoint_pairs(steps({5}), steps({}), 0).empty());
  // At most N, evenly spaced, first and last kept.
  std::map<int64_t, std::string> many;
  for (int s = 1; s <= 100; ++s) many[s] = "f";
  const V few = flat(checkpoint_pairs(many, many, 4));
  EXPECT_EQ(few, (V{{1, 1}, {34, 34}, {67, 67}, {100, 100}}));
}

namespace {

// The report of run B against a copy of itself (every distance is zero).
fs::path html_same() {
  static const fs::path out = [] {
    const fs::path copy = tmp_root() / "run_b_copy";
    fs::remove_all(copy);
    fs::copy(run_b(), copy, fs::copy_options::recursive);
    const fs::path o = tmp_root() / "same.html";
    const Cmd r = report(q(run_b()) + " " + q(copy) + " -o " + q(o));
    EXPECT_EQ(r.code, 0) << r.err;
    return o;
  }();
  return out;
}

}  // namespace

TEST(ReportHtml, IdenticalRunsHaveZeroDistanceAndOneRunSaysSo) {
  const fs::path copy = tmp_root() / "run_b_copy";
  const nlohmann::json d = page_data(slurp(html_same()));
  // Same run.name twice: the names are told apart by directory.
  EXPECT_EQ(d["runs"][1]["name"], "run_b (" + copy.string() + ")");
  ASSERT_EQ(d["distance"].size(), 1u);
  size_t values = 0;
  for (const auto& x : d["distance"][0]["series"])
    for (const char* k : {"w1n", "max"})
      for (const auto& v : x[k]) {
        EXPECT_EQ(v, 0.0);
        ++values;
      }
  EXPECT_GT(values, 50u);
  EXPECT_EQ(d["runs"][1]["dloss"]["y"].size(), d["runs"][0]["train"]["loss"].size());
  for (const auto& v : d["runs"][1]["dloss"]["y"]) EXPECT_EQ(v, 0.0);

  const Cmd one = report(q(run_b()) + " -o " + q(tmp_root() / "one.html"));
  ASSERT_EQ(one.code, 0) << one.err;
  const nlohmann::json d1 = page_data(slurp(tmp_root() / "one.html"));
  EXPECT_EQ(d1["distance_notes"][0], "one run given: pass two or more runs to compare their weights");
}

TEST(ReportHtml, RendersInChromium) {
  const Render r = render_page(html_ab(), "report_ab.png", tmp_root());
  expect_clean(r);
  // Run A (synthetic hook files, no grad_norms.csv) and run B (no hooks), both with
  // validation losses: the panels and series the page must draw.
  const std::map<std::string, int> want = {
      {"loss", 4},  // two runs' training loss, two runs' validation loss
      {"dloss", 1}, {"dval", 1}, {"grad_norm", 2}, {"lr", 2},
      {"spectral:wq:L0", 2}, {"spectral:wq:L1", 2},  // run A's two heads
      {"attention:max_logit:L0", 2}, {"attention:max_logit:L1", 2},
      {"drift:delta_drift_cum:L0", 2}, {"drift:delta_drift_cum:L1", 2},
      {"distance:w1n:qkvw:L0", 1}, {"distance:w1n:qkvw:L1", 1},  // run B against run A
  };
  EXPECT_EQ(r.panels, want) << dump_panels(r.panels);
  EXPECT_NE(r.dom.find("Training stability report"), std::string::npos);
  EXPECT_NE(r.dom.find("flash · Õ 3 bits"), std::string::npos);  // run A's attention cell
  EXPECT_NE(r.dom.find("run_b: no spectral.csv: the run had hooks.every: 0"), std::string::npos);
  EXPECT_NE(r.dom.find("run_a: spectral.csv: skipped an incomplete last line"), std::string::npos);
  std::printf("  screenshot %s, %zu panels\n", r.png.c_str(), r.panels.size());

  // Identical runs: the page says so in words.
  const Render same = render_page(html_same(), "report_same.png", tmp_root());
  expect_clean(same);
  EXPECT_NE(same.dom.find("the weights are identical to the reference at every compared step"), std::string::npos);
}

TEST(ReportHtml, WatchRewritesThePageUntilInterrupted) {
  const fs::path out = tmp_root() / "watch.html", log = tmp_root() / "watch.out";
  fs::remove(out);
  // Rewritten every second; after 3.5 s SIGINT ends it with a line saying so.
  const int code = sh("( " + std::string(ST_REPORT_BIN) + " " + q(run_b()) + " --no-checkpoints --watch 1 -o " +
                      q(out) + " >" + q(log) + " 2>&1 & pid=$!; sleep 1.5; a=$(stat -c %Y.%s " + q(out) +
                      "); sleep 2; kill -INT $pid; wait $pid; echo \"exit=$?\" >>" + q(log) + " )");
  EXPECT_EQ(code, 0);
  const std::string o = slurp(log);
  EXPECT_NE(o.find("rewritten every 1 s until Ctrl-C"), std::string::npos) << o;
  EXPECT_NE(o.find("report: stopped watching"), std::string::npos) << o;
  EXPECT_NE(o.find("exit=0"), std::string::npos) << o;
  const nlohmann::json d = page_data(slurp(out));
  ASSERT_TRUE(d.is_object());
  EXPECT_EQ(d["refresh_s"], 1);
  EXPECT_FALSE(fs::exists(out.string() + ".tmp")) << "the temporary file was left behind";
}
