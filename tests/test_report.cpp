// `report` end to end: two real tiny runs from the `train` binary (metrics.jsonl,
// checkpoints) plus hook files written here with values chosen to be checked
// (spectral.csv, attn_stats.csv, delta_drift.csv, events.jsonl); the --text table's order
// and growth figures, robust CSV reading, the page's data document against the run files
// (Δloss exactly, weight distances between checkpoints, the reference chosen on the command
// line), the page rendered by headless Chromium (no console output, every panel with its
// expected number of series, a screenshot under the build folder's test_artifacts/),
// --watch, bad input, and that nothing but the -o file is written. `RealHooks` trains with
// hooks.every=5 and reports on the files the trainer's hooks wrote.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "report_page.h"
#include "test_util.h"
#include "apps/report/run_data.h"
#include "apps/report/html_report.h"

namespace fs = std::filesystem;
using st::test::sh;
using st::test::slurp;
using st::test::dump_panels;
using st::test::expect_clean;
using st::test::page_data;
using st::test::Render;
using st::test::render_page;

namespace {

const fs::path& tmp_root() {
  static const fs::path p = st::test::make_scratch_dir("st_report_test_");
  return p;
}

struct Cmd {
  int code;
  std::string out, err;
};

// Runs a command line; its exit code, stdout and stderr.
Cmd run(const std::string& cmdline) {
  const fs::path o = tmp_root() / "cmd_stdout.txt", e = tmp_root() / "cmd_stderr.txt";
  const int code = sh(cmdline + " >" + o.string() + " 2>" + e.string());
  return {code, slurp(o), slurp(e)};
}

Cmd report(const std::string& args) { return run(std::string(ST_REPORT_BIN) + " " + args); }

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

std::string tiny_yaml(const fs::path& out_dir, const std::string& name, int seed, const std::string& prec) {
  std::ostringstream y;
  y << "run: {name: " << name << ", out_dir: '" << out_dir.string() << "', seed: " << seed << "}\n"
    << "model: {n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 32, vocab_size: 256}\n"
    << "data: {train_path: '" ST_SHARED_DATA_DIR "/tinyshakespeare.txt', tokenizer: byte, val_fraction: 0.1}\n"
    << "train: {max_steps: 20, batch_size: 4, seq_len: 32, lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 3,"
    << " ckpt_every: 10, keep_checkpoints: 0, eval_every: 10, eval_batches: 2, log_every: 10, sample_tokens: 0}\n"
    << "precision: {compute: " << prec << "}\n"
    << "device: cpu\n";
  return y.str();
}

// Trains a tiny run (once per test program) and returns its directory.
fs::path train_run(const std::string& name, int seed, const std::string& prec, const std::string& extra = "") {
  const fs::path dir = tmp_root() / name;
  if (fs::exists(dir / "metrics.jsonl")) return dir;
  const fs::path cfg = tmp_root() / (name + ".yaml");
  std::ofstream(cfg) << tiny_yaml(dir, name, seed, prec);
  const Cmd r = run(std::string(ST_TRAIN_BIN) + " --config " + q(cfg) + " " + extra);
  EXPECT_EQ(r.code, 0) << "train failed: " << r.err;
  return dir;
}

std::string num(double v) {
  std::ostringstream s;
  s.precision(12);
  s << v;
  return s.str();
}

// Hook files with chosen values for a 2-layer, 2-head run over steps 0, 5, 10, 15, 20.
//   spectral wq: L0H0 2 -> 2.5 (x1.25), L0H1 1.5 -> 1.5, L1H0 3 -> 3.3 (x1.1), L1H1 1 -> 4 (x4)
//   spectral wk: L0H1 2.5 -> 5 (x2), the others constant below 1.5
//   delta drift: L1H1 errs +1e-7 at every hook step (one-signed), the others alternate
// `none` is the layer / head field of a row that is not per layer / head: "-1" as train
// writes it, "" as files written before that have it.
void write_hook_files(const fs::path& dir, bool truncated_tail, const std::string& none = "-1") {
  const int steps[] = {0, 5, 10, 15, 20};
  {
    std::ofstream f(dir / "spectral.csv");
    f << "step,layer,head,matrix,sigma,iters,converged\n";
    for (int s : steps) {
      const double t = s / 20.0;
      f << s << "," << none << "," << none << ",wte," << num(4 + t) << ",7,1\n"
        << s << "," << none << "," << none << ",wpe," << num(1.5 + 0.3 * t) << ",7,1\n";
      for (int l = 0; l < 2; ++l) {
        const char* mats[] = {"qkvw", "attprojw", "fcw", "fcprojw"};
        for (int m = 0; m < 4; ++m) f << s << "," << l << "," << none << "," << mats[m] << "," << num(2 + 0.2 * l + 0.1 * m + 0.2 * t) << ",9,1\n";
        for (int h = 0; h < 2; ++h) {
          const double wq[2][2] = {{2 + 0.5 * t, 1.5}, {3 + 0.3 * t, 1 + 3 * t}};
          const double wk = (l == 0 && h == 1) ? 2.5 + 2.5 * t : 1.0 + 0.1 * (2 * l + h);
          f << s << "," << l << "," << h << ",wq," << num(wq[l][h]) << ",5,1\n";
          f << s << "," << l << "," << h << ",wk," << num(wk) << ",5,1\n";
          f << s << "," << l << "," << h << ",wv," << num(0.5 + 0.1 * (2 * l + h) + 0.05 * t) << ",5,1\n";
          f << s << "," << l << "," << h << ",wo," << num(0.6 + 0.1 * (2 * l + h) + 0.05 * t) << ",5,0\n";
        }
      }
    }
    // A run still writing: half a line at the end, with a sigma that would top the table.
    if (truncated_tail) f << "20,0,1,wq,99";
  }
  {
    std::ofstream f(dir / "attn_stats.csv");
    f << "step,layer,head,stat,value\n";
    for (int s : steps) {
      if (s == 0) continue;
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < 2; ++h) {
          f << s << "," << l << "," << h << ",max_logit," << num(4 + 2 * l + h + s * (l == 1 && h == 1 ? 1 : 0.1)) << "\n"
            << s << "," << l << "," << h << ",tied_row_frac," << num(0.01 * l * s / 20) << "\n"
            << s << "," << l << "," << h << ",tied_in_tile_frac," << num(0.005 * l * s / 20) << "\n"
            << s << "," << l << "," << h << ",p_one," << 4 + l * s / 5 << "\n"
            << s << "," << l << "," << h << ",p_tilde_one," << 64 + l * s << "\n"
            << s << "," << l << "," << h << ",entropy," << num(3 - 0.05 * s * (l + 1) - 0.1 * h) << "\n";
        }
    }
  }
  {
    std::ofstream f(dir / "delta_drift.csv");
    f << "step,layer,head,delta_drift,delta_drift_cum,delta_abs_err,dwq_err_norm,dwq_rel_err,dwq_cos_prev\n";
    double cum[2][2] = {};
    for (int s : steps) {
      if (s == 0) continue;
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < 2; ++h) {
          const bool biased = l == 1 && h == 1;
          const double d = biased ? 1e-7 : ((s / 5 + l + h) % 2 ? 1e-8 : -1e-8);
          cum[l][h] += d;
          f << s << "," << l << "," << h << "," << num(d) << "," << num(cum[l][h]) << "," << num(2 * std::fabs(d))
            << ",1e-05," << num(1e-3 * (l + 1)) << "," << (s == 5 ? "" : biased ? "0.9" : "0.05") << "\n";
        }
    }
  }
  std::ofstream(dir / "events.jsonl")
      << R"({"step":12,"event":"spike","metric":"loss","value":6.5,"mean":4.9,"std":0.1,"z":16,"action":"snapshot"})"
      << "\n";
}

// Run A: a real bf16 run (flash with O~ narrowed to 3 fraction bits, which the table shows)
// without hooks plus the hook files above. Run B: a real fp32 run without hooks.
fs::path run_a() {
  static const fs::path d = [] {
    const fs::path p = train_run("run_a", 1, "bf16",
                                 "--set hooks.every=0 --set attention.backend=flash "
                                 "--set attention.o_tilde_bits=3");
    write_hook_files(p, true);
    return p;
  }();
  return d;
}
fs::path run_b() {
  static const fs::path d = train_run("run_b", 2, "fp32", "--set hooks.every=0");
  return d;
}

// The data rows of the table that follows the line starting with `title` in --text output.
std::vector<std::vector<std::string>> table_after(const std::string& out, const std::string& title) {
  std::istringstream in(out);
  std::vector<std::vector<std::string>> rows;
  bool in_table = false, header_seen = false;
  for (std::string line; std::getline(in, line);) {
    if (!in_table) {
      in_table = line.rfind(title, 0) == 0;
      continue;
    }
    if (line.empty()) break;
    std::istringstream ls(line);
    std::vector<std::string> f;
    for (std::string w; ls >> w;) f.push_back(w);
    if (!header_seen) {
      header_seen = true;
      continue;
    }
    rows.push_back(f);
  }
  return rows;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// Every file under `dir` with its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[e.path().string()] = slurp(e.path());
  return m;
}

}  // namespace

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

// ---------------------------------------------------------------- bad input

TEST(ReportBadInput, OneLineErrorsNamingThePath) {
  const fs::path out = tmp_root() / "bad.html";
  const fs::path empty = tmp_root() / "empty_dir";
  fs::create_directories(empty);
  const fs::path not_html = tmp_root() / "notes.txt";
  std::ofstream(not_html) << "keep me\n";
  struct Case {
    std::string args, expect;
  } cases[] = {
      {q(tmp_root() / "no_such_run") + " -o " + q(out), (tmp_root() / "no_such_run").string() + "' does not exist"},
      {q(empty) + " -o " + q(out), empty.string() + "' has no metrics.jsonl"},
      {q(run_b()) + " -o " + q(tmp_root() / "no_such_folder" / "r.html"), "no_such_folder' does not exist"},
      {q(run_b()) + " -o " + q(empty), empty.string() + "' is a directory"},
      {q(run_b()) + " -o " + q(not_html), not_html.string() + "' exists and is not an .html file"},
      {q(run_b()) + " -o " + q(run_b() / "metrics.jsonl"), "metrics.jsonl' exists and is not an .html file"},
      {q(run_b()), "no output file"},
  };
  const auto before = snapshot(run_b());
  for (const Case& c : cases) {
    const Cmd r = report(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1u) << "not one line: " << r.err;
    EXPECT_EQ(r.err.rfind("report: error: ", 0), 0u) << r.err;
    std::printf("  %s", r.err.c_str());
  }
  EXPECT_FALSE(fs::exists(out)) << "a refused report wrote its -o file";
  EXPECT_EQ(slurp(not_html), "keep me\n");
  EXPECT_EQ(before, snapshot(run_b()));
}

// A metrics.jsonl with lines that are not JSON (the probe: a binary file and a `{garbage`
// line each exited 0, the note only inside the page): the skipped lines are counted on the
// console with the file's path; a run with no readable line at all is an error, and a
// partly readable one a warning beside a written page.
TEST(ReportBadInput, UnreadableMetricsLinesAreSaidOnTheConsole) {
  const fs::path out = tmp_root() / "garbage.html";
  auto run_with = [&](const std::string& name, const std::string& metrics) {
    const fs::path d = tmp_root() / name;
    fs::remove_all(d);
    fs::create_directories(d);
    fs::copy_file(run_b() / "config.yaml", d / "config.yaml");
    std::ofstream(d / "metrics.jsonl", std::ios::binary) << metrics;
    return d;
  };
  std::string binary(5000, '\0');
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = char((i * 7919 + 13) % 256);
  for (const auto& [name, metrics, skipped] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"garbage_bin", binary, "malformed line"},
           {"garbage_line", "{garbage\n", "skipped 1 malformed line"},
           {"garbage_empty", "", "empty: the run has not logged a step yet"}}) {
    SCOPED_TRACE(name);
    const fs::path d = run_with(name, metrics);
    const Cmd r = report(q(d) + " -o " + q(out));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("report: error: '" + d.string() + "/metrics.jsonl' has no readable line"),
              std::string::npos) << r.err;
    EXPECT_NE(r.err.find(skipped), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
    std::printf("  %s", r.err.c_str());
  }
  // Readable lines and one garbage line: the page is written, the console says what was left out.
  std::string good = slurp(run_b() / "metrics.jsonl");
  const fs::path d = run_with("garbage_some", good + "{garbage\n" + "\x01\x02\n");
  const Cmd r = report(q(d) + " --no-checkpoints -o " + q(out));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("report: warning: " + d.string() + "/metrics.jsonl: skipped 2 malformed lines"),
            std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(out));
  std::printf("  %s", r.err.c_str());
}

// Issue 19: a corrupted hook CSV (a huge layer or head index, a bad step, a field that is
// not a number, a short line), a config.yaml with a huge model.n_layer, or a metrics.jsonl
// that is a directory gave SIGSEGV, std::bad_alloc or a silently incomplete report. Each
// is now one line naming file:line and the field, exit status 1, and binary bytes are
// escaped.
TEST(ReportBadInput, CorruptHookFilesAreOneLineErrors) {
  struct Case {
    std::string file, line, expect;
  } cases[] = {
      {"spectral.csv", "60,2147483647,0,wq,1.0,3,1", "field 'layer' = '2147483647': expected -1 or a layer index in [0, 1]"},
      {"spectral.csv", "60,0,2147483647,wq,1.0,3,1", "field 'head' = '2147483647'"},
      {"spectral.csv", "60,2,0,wq,1.0,3,1", "field 'layer' = '2'"},
      {"spectral.csv", "60,-2,0,wq,1.0,3,1", "field 'layer' = '-2'"},
      {"spectral.csv", "60,1e300,0,wq,1.0,3,1", "field 'layer' = '1e300'"},
      {"spectral.csv", "60,0,0,wq,1.0x,3,1", "field 'sigma' = '1.0x': expected a number"},
      {"spectral.csv", "60,0,0,wq", "4 fields ('60,0,0,wq'), expected 7"},
      {"spectral.csv", std::string("60,\x01\xff,0,wq,1,3,1"), "field 'layer' = '\\x01\\xff'"},
      {"attn_stats.csv", "x5,0,0,max_logit,1", "field 'step' = 'x5': expected an integer step >= 0"},
      {"attn_stats.csv", "-5,0,0,max_logit,1", "field 'step' = '-5'"},
      {"attn_stats.csv", "5,0,99999999999,max_logit,1", "field 'head' = '99999999999'"},
      {"delta_drift.csv", "60,2147483647,0,1e-8,1e-8,1e-8,1e-05,1e-3,0.5", "field 'layer' = '2147483647'"},
      {"delta_drift.csv", "60,0,7,1e-8,1e-8,1e-8,1e-05,1e-3,0.5", "field 'head' = '7'"},
  };
  int k = 0;
  for (const Case& c : cases) {
    const fs::path d = tmp_root() / ("corrupt_" + std::to_string(k++));
    fs::remove_all(d);
    fs::create_directories(d);
    for (const char* f : {"metrics.jsonl", "config.yaml"}) fs::copy_file(run_b() / f, d / f);
    write_hook_files(d, false);
    const size_t line_no = count(slurp(d / c.file), "\n") + 1;
    std::ofstream(d / c.file, std::ios::app | std::ios::binary) << c.line << "\n";
    for (const std::string& args : {"--text " + q(d), q(d) + " -o " + q(d / "r.html")}) {
      const Cmd r = report(args);
      EXPECT_EQ(r.code, 1) << c.line << "\n" << r.err;
      EXPECT_NE(r.err.find(c.file + ":" + std::to_string(line_no) + ": "), std::string::npos)
          << c.line << "\n" << r.err;
      EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.line << "\n" << r.err;
      EXPECT_EQ(count(r.err, "\n"), 1u) << "not one line: " << r.err;
      EXPECT_EQ(r.err.rfind("report: error: ", 0), 0u) << r.err;
      for (char ch : r.err) EXPECT_TRUE(ch == '\n' || (ch >= 0x20 && ch < 0x7f)) << "unprintable byte in: " << r.err;
    }
    EXPECT_FALSE(fs::exists(d / "r.html"));
  }

  // A huge model.n_layer in config.yaml sized the tables (std::bad_alloc).
  {
    const fs::path d = tmp_root() / "corrupt_config";
    fs::remove_all(d);
    fs::create_directories(d);
    fs::copy_file(run_b() / "metrics.jsonl", d / "metrics.jsonl");
    write_hook_files(d, false);
    std::string cfg = slurp(run_b() / "config.yaml");
    cfg = std::regex_replace(cfg, std::regex("n_layer: 2"), "n_layer: 2000000000");
    std::ofstream(d / "config.yaml") << cfg;
    const Cmd r = report(q(d) + " -o " + q(d / "r.html"));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("config.yaml: model.n_layer = '2000000000': expected an integer between 1 and"),
              std::string::npos) << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
  }
  // metrics.jsonl (or a hook file) that is a directory is not read as empty.
  for (const char* f : {"metrics.jsonl", "spectral.csv", "config.yaml", "events.jsonl"}) {
    const fs::path d = tmp_root() / (std::string("dir_as_") + f);
    fs::remove_all(d);
    fs::create_directories(d);
    for (const char* g : {"metrics.jsonl", "config.yaml"}) fs::copy_file(run_b() / g, d / g);
    fs::remove(d / f);
    fs::create_directories(d / f);
    const Cmd r = report(q(d) + " -o " + q(d / "r.html"));
    EXPECT_EQ(r.code, 1) << f << ": " << r.err;
    EXPECT_NE(r.err.find(f + std::string("' is not a regular file")), std::string::npos) << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
  }
}

// ---------------------------------------------------------------- real hooks

// A real run with the trainer's stability hooks; the report must find and draw every
// hook file. Needs `train` with hooks.every (writing spectral.csv, attn_stats.csv,
// delta_drift.csv at steps 0/5/10/15/20).
TEST(RealHooks, ReportOnARunWithHooksEvery5) {
  const fs::path dir = train_run("run_hooks", 3, "bf16", "--set hooks.every=5");
  ASSERT_TRUE(fs::exists(dir / "metrics.jsonl")) << "the run with hooks.every=5 did not start";
  for (const char* f : {"spectral.csv", "attn_stats.csv", "delta_drift.csv"})
    ASSERT_TRUE(fs::exists(dir / f)) << f << " missing from a run with hooks.every=5";
  const Cmd t = report("--text " + q(dir));
  ASSERT_EQ(t.code, 0) << t.err;
  std::printf("%s", t.out.c_str());
  const auto rows = table_after(t.out, "wq per head");
  ASSERT_EQ(rows.size(), 4u) << t.out;  // 2 layers x 2 heads
  for (size_t i = 1; i < rows.size(); ++i)
    EXPECT_GE(std::stod(rows[i - 1][3]), std::stod(rows[i][3])) << "not sorted by the last sigma:\n" << t.out;
  for (const auto& r : rows) {
    const double first = std::stod(r[2]), last = std::stod(r[3]), growth = std::stod(r[4]);
    EXPECT_GT(first, 0);
    EXPECT_NEAR(growth, last / first, 1e-3 * growth + 1e-3);
  }
  const fs::path out = tmp_root() / "hooks.html";
  const Cmd h = report(q(dir) + " " + q(run_a()) + " -o " + q(out));
  ASSERT_EQ(h.code, 0) << h.err;
  const nlohmann::json d = page_data(slurp(out));
  const auto& run = d["runs"][0];
  for (const char* f : {"spectral", "attn", "drift", "grad"})
    EXPECT_TRUE(run["files"][f]["present"].get<bool>()) << f << ": " << run["files"][f]["note"];
  std::set<std::string> mats, stats;
  for (const auto& x : run["spectral"]) mats.insert(x["m"]);
  for (const auto& x : run["attn"]) stats.insert(x["s"]);
  EXPECT_EQ(mats, (std::set<std::string>{"wq", "wk", "wv", "wo", "qkvw", "attprojw", "fcw", "fcprojw", "wte", "wpe"}));
  EXPECT_EQ(stats, (std::set<std::string>{"max_logit", "tied_row_frac", "tied_in_tile_frac", "p_one", "p_tilde_one",
                                          "entropy"}));
  // Gradient norm per layer = the L2 norm over the layer's tensors in grad_norms.csv
  // (per-head slices left out), recomputed here from the file.
  std::map<std::pair<int64_t, int>, double> g2;
  {
    std::istringstream in(slurp(dir / "grad_norms.csv"));
    std::string line;
    std::getline(in, line);
    ASSERT_EQ(line, "step,tensor,layer,head,norm");
    while (std::getline(in, line)) {
      const auto f = st::report::split_csv_line(line);
      ASSERT_EQ(f.size(), 5u) << line;
      const int layer = f[2].empty() ? -1 : std::stoi(f[2]), head = f[3].empty() ? -1 : std::stoi(f[3]);
      if (head < 0) g2[{std::stoll(f[0]), layer}] += std::stod(f[4]) * std::stod(f[4]);
    }
  }
  ASSERT_EQ(run["grad"].size(), 3u);  // embeddings, L0, L1
  size_t checked = 0;
  for (const auto& g : run["grad"])
    for (size_t i = 0; i < g["x"].size(); ++i, ++checked)
      EXPECT_NEAR(g["y"][i].get<double>(), std::sqrt(g2.at({g["x"][i].get<int64_t>(), g["l"].get<int>()})),
                  1e-12 * g["y"][i].get<double>());
  EXPECT_EQ(checked, g2.size());

  // Both runs drawn on shared panels: run_hooks' and run A's heads in one spectral panel.
  const Render r = render_page(out, "report_hooks.png", tmp_root());
  expect_clean(r);
  EXPECT_EQ(r.panels.at("grad:embeddings"), 1);
  EXPECT_EQ(r.panels.at("grad:L1"), 1);
  EXPECT_EQ(r.panels.at("spectral:wq:L0"), 4);
  EXPECT_EQ(r.panels.at("attention:max_logit:L1"), 4);
  EXPECT_EQ(r.panels.at("drift:delta_drift_cum:L1"), 4);
  EXPECT_EQ(r.panels.at("loss"), 4);

  // A view in the address: the named selections, and only the named sections shown.
  const Render v = render_page(out, "report_hooks_view.png", tmp_root(),
                               "?only=spectral,drift&spectral=wk&drift=delta_drift&attn=nonsense");
  expect_clean(v);
  EXPECT_EQ(v.panels.count("spectral:wq:L0"), 0u) << dump_panels(v.panels);
  EXPECT_EQ(v.panels.at("spectral:wk:L0"), 4);
  EXPECT_EQ(v.panels.at("drift:delta_drift:L1"), 4);
  EXPECT_EQ(v.panels.at("attention:max_logit:L1"), 4);  // an unknown value: the default
  const auto hidden = [&](const std::string& id) {
    return v.dom.find("<section id=\"" + id + "\" style=\"display: none;\">") != std::string::npos;
  };
  EXPECT_TRUE(hidden("loss") && hidden("grad") && hidden("attention")) << v.dom.substr(0, 4000);
  EXPECT_FALSE(hidden("spectral") || hidden("drift"));
}

