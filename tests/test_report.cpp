// `report` end to end: two real tiny runs from the `train` binary (metrics.jsonl,
// checkpoints) plus hook files written here with values chosen to be checked
// (spectral.csv, attn_stats.csv, delta_drift.csv, events.jsonl); the --text table's order
// and growth figures, robust CSV reading, the HTML page's sections and notes, weight
// distances between checkpoints, a render in headless Chromium, bad input, and that nothing
// but the -o file is written. `RealHooks` trains with hooks.every=5 and reports on the
// files the trainer's hooks wrote.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "test_util.h"
#include "tools/report/run_data.h"
#include "tools/report/svg_chart.h"

namespace fs = std::filesystem;
using st::test::sh;
using st::test::slurp;

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
void write_hook_files(const fs::path& dir, bool truncated_tail) {
  const int steps[] = {0, 5, 10, 15, 20};
  {
    std::ofstream f(dir / "spectral.csv");
    f << "step,layer,head,matrix,sigma,iters,converged\n";
    for (int s : steps) {
      const double t = s / 20.0;
      f << s << ",,,wte," << num(4 + t) << ",7,1\n" << s << ",,,wpe," << num(1.5 + 0.3 * t) << ",7,1\n";
      for (int l = 0; l < 2; ++l) {
        const char* mats[] = {"qkvw", "attprojw", "fcw", "fcprojw"};
        for (int m = 0; m < 4; ++m) f << s << "," << l << ",," << mats[m] << "," << num(2 + 0.2 * l + 0.1 * m + 0.2 * t) << ",9,1\n";
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

// Run A: a real bf16 run without hooks plus the hook files above. Run B: a real fp32 run
// without hooks.
fs::path run_a() {
  static const fs::path d = [] {
    const fs::path p = train_run("run_a", 1, "bf16", "--set hooks.every=0");
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

TEST(ReportChart, NiceTicksAndLabels) {
  using namespace st::report;
  EXPECT_EQ(nice_ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  EXPECT_EQ(nice_ticks(1, 300, 4), (std::vector<double>{100, 200, 300}));
  EXPECT_EQ(log_ticks(1e-3, 2), (std::vector<double>{1e-3, 1e-2, 1e-1, 1}));
  EXPECT_EQ(tick_label(0.6000000000000001, 0.2), "0.6");
  EXPECT_EQ(tick_label(20000, 5000), "20k");
  EXPECT_EQ(tick_label(2.5e-9, 5e-10), "2.5e-9");
  EXPECT_EQ(log_tick_label(1e-5), "10⁻⁵");
  EXPECT_EQ(log_tick_label(0.02), "0.02");
  EXPECT_EQ(short_num(4.0), "4");
  EXPECT_EQ(short_num(1.2345e-7), "1.23e-7");
  EXPECT_EQ(esc("a<b&\"c\""), "a&lt;b&amp;&quot;c&quot;");
}

// ---------------------------------------------------------------- HTML

namespace {

// The chart <svg> elements of a page (class "chart"), each as its text.
std::vector<std::string> charts(const std::string& html) {
  std::vector<std::string> out;
  const std::regex open("<svg[^>]*class=\"chart");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), open); it != std::sregex_iterator(); ++it) {
    const size_t a = static_cast<size_t>(it->position()), b = html.find("</svg>", a);
    out.push_back(html.substr(a, b == std::string::npos ? std::string::npos : b - a));
  }
  return out;
}

// True when a chart draws something: a line with at least two points, or heatmap cells.
bool draws(const std::string& svg) {
  static const std::regex line("<path d=\"M[-0-9.]+ [-0-9.]+[Lh]");  // h: a lone point
  static const std::regex cell("<rect [^>]*fill=\"#[0-9a-f]{6}\"");
  return std::regex_search(svg, line) || std::regex_search(svg, cell);
}

// 3 loss charts; run A: 2 W_Q panels, 4 + 4 heatmaps, 4 per-layer + 1 embedding panel,
// 6 attention panels, 2 drift panels + 2 heatmaps + 2 charts; A vs B: 2 distance charts.
constexpr size_t kChartsAB = 3 + (2 + 8 + 5) + 6 + (2 + 2 + 2) + 2;

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

TEST(ReportHtml, SectionsChartsAndNotes) {
  const auto before_a = snapshot(run_a()), before_b = snapshot(run_b());
  const Cmd r = report(q(run_a()) + " " + q(run_b()) + " -o " + q(tmp_root() / "sections.html"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string html = slurp(tmp_root() / "sections.html");
  ASSERT_FALSE(html.empty());
  // Nothing in the runs was written or removed.
  EXPECT_EQ(before_a, snapshot(run_a()));
  EXPECT_EQ(before_b, snapshot(run_b()));

  for (const char* id : {"loss", "spectral", "attention", "drift", "distance"})
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  const auto svgs = charts(html);
  EXPECT_EQ(svgs.size(), kChartsAB);
  for (size_t i = 0; i < svgs.size(); ++i) EXPECT_TRUE(draws(svgs[i])) << "chart " << i << " is empty:\n" << svgs[i];
  // Header: both runs with their config values.
  EXPECT_NE(html.find(">run_a<"), std::string::npos);
  EXPECT_NE(html.find(">run_b<"), std::string::npos);
  EXPECT_NE(html.find("<td>bf16</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>fp32</td>"), std::string::npos);
  EXPECT_NE(html.find("2L · 2H · 32C · T 32 · V 256"), std::string::npos);
  // Run B has no hook files: one line each.
  EXPECT_NE(html.find("no spectral.csv: the run had hooks.every: 0"), std::string::npos);
  EXPECT_NE(html.find("no attn_stats.csv: the run had hooks.every: 0"), std::string::npos);
  EXPECT_NE(html.find("no delta_drift.csv: the run had hooks.every: 0"), std::string::npos);
  // Values from the synthetic files, in the hover text.
  EXPECT_NE(html.find("spike in loss at step 12: 6.5 (mean 4.9 ± 0.1), z 16, action: snapshot"), std::string::npos);
  EXPECT_NE(html.find("L1 H1: σ 1 → 4 (×4)"), std::string::npos);
  EXPECT_NE(html.find("L1 H1: |Σ drift| / Σ|drift| = 1 "), std::string::npos);
  EXPECT_NE(html.find("spectral.csv: skipped an incomplete last line"), std::string::npos);
  // Weight distances from the two runs' checkpoints at steps 10 and 20.
  EXPECT_NE(html.find("2 shared checkpoint steps: 10 … 20"), std::string::npos);
  // Self-contained: no scripts, nothing fetched.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("url(http"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
}

TEST(ReportHtml, IdenticalRunsHaveZeroDistanceAndOneRunSaysSo) {
  // A copy of run B's checkpoints: the distance section says the weights are identical.
  const fs::path copy = tmp_root() / "run_b_copy";
  fs::remove_all(copy);
  fs::copy(run_b(), copy, fs::copy_options::recursive);
  const Cmd r = report(q(run_b()) + " " + q(copy) + " -o " + q(tmp_root() / "same.html"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string html = slurp(tmp_root() / "same.html");
  EXPECT_NE(html.find("identical at every compared step"), std::string::npos);
  // Same run.name twice: the names are told apart by directory.
  EXPECT_NE(html.find("run_b (" + copy.string() + ")"), std::string::npos);

  const Cmd one = report(q(run_b()) + " -o " + q(tmp_root() / "one.html"));
  ASSERT_EQ(one.code, 0) << one.err;
  const std::string h1 = slurp(tmp_root() / "one.html");
  EXPECT_NE(h1.find("one run given"), std::string::npos);
  EXPECT_EQ(charts(h1).size(), 3u) << "a run without hook files has the three loss charts only";
}

TEST(ReportHtml, RendersInChromium) {
  const std::string chromium = ST_CHROMIUM;
  ASSERT_TRUE(fs::exists(chromium)) << "chromium not found at " << chromium
                                    << " (Debian: apt-get install chromium); the render check needs it";
  const fs::path html = html_ab();
  const fs::path png = tmp_root() / "ab.png", dom = tmp_root() / "ab_dom.html", log = tmp_root() / "chromium.log";
  const std::string common = "timeout 180 " + chromium +
                             " --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run"
                             " --disable-extensions --enable-logging=stderr --v=0 --user-data-dir=" +
                             q(tmp_root() / "chromium_profile") + " ";
  const std::string url = "file://" + html.string();
  ASSERT_EQ(sh(common + "--window-size=1400,4000 --screenshot=" + q(png) + " " + q(url) + " >/dev/null 2>" + q(log)), 0)
      << slurp(log);
  const std::string log1 = slurp(log);
  ASSERT_EQ(sh(common + "--dump-dom " + q(url) + " >" + q(dom) + " 2>" + q(log)), 0) << slurp(log);
  const std::string log2 = slurp(log);

  // The screenshot: a PNG of the window's size with real content.
  const std::string p = slurp(png);
  ASSERT_GT(p.size(), 24u) << "no screenshot";
  EXPECT_EQ(p.substr(1, 3), "PNG");
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(p[at])) << 24) | (uint32_t(uint8_t(p[at + 1])) << 16) |
           (uint32_t(uint8_t(p[at + 2])) << 8) | uint32_t(uint8_t(p[at + 3]));
  };
  EXPECT_EQ(be32(16), 1400u);
  EXPECT_EQ(be32(20), 4000u);
  EXPECT_GT(p.size(), 100000u) << "the screenshot is nearly blank";

  // The DOM Chromium built holds every chart, each drawing something.
  const std::string d = slurp(dom);
  const auto svgs = charts(d);
  EXPECT_EQ(svgs.size(), kChartsAB);
  for (size_t i = 0; i < svgs.size(); ++i) EXPECT_TRUE(draws(svgs[i])) << "chart " << i;
  EXPECT_NE(d.find("Training stability report"), std::string::npos);
  // No script errors, nothing blocked or fetched.
  for (const std::string& l : {log1, log2}) {
    EXPECT_EQ(l.find("Uncaught"), std::string::npos) << l;
    EXPECT_EQ(l.find("net::ERR"), std::string::npos) << l;
    EXPECT_EQ(l.find("Refused to"), std::string::npos) << l;
  }
  std::printf("  screenshot %s (%zu bytes), %zu charts in the DOM\n", png.c_str(), p.size(), svgs.size());
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

// Issue 19: a corrupted hook CSV (a huge layer or head index, a bad step, a field that is
// not a number, a short line), a config.yaml with a huge model.n_layer, or a metrics.jsonl
// that is a directory gave SIGSEGV, std::bad_alloc or a silently incomplete report. Each
// is now one line naming file:line and the field, exit status 1, and binary bytes are
// escaped.
TEST(ReportBadInput, CorruptHookFilesAreOneLineErrors) {
  struct Case {
    std::string file, line, expect;
  } cases[] = {
      {"spectral.csv", "60,2147483647,0,wq,1.0,3,1", "field 'layer' = '2147483647': expected a layer index in [0, 1]"},
      {"spectral.csv", "60,0,2147483647,wq,1.0,3,1", "field 'head' = '2147483647'"},
      {"spectral.csv", "60,2,0,wq,1.0,3,1", "field 'layer' = '2'"},
      {"spectral.csv", "60,-1,0,wq,1.0,3,1", "field 'layer' = '-1'"},
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
  const std::string html = slurp(out);
  for (const char* f : {"no spectral.csv", "no attn_stats.csv", "no delta_drift.csv", "could not be read"})
    EXPECT_EQ(html.find(f), std::string::npos) << f;
  const auto svgs = charts(html);
  // Both runs have every hook file: twice the per-run charts of run A, plus loss and distance.
  EXPECT_EQ(svgs.size(), kChartsAB + (2 + 8 + 5) + 6 + (2 + 2 + 2));
  for (size_t i = 0; i < svgs.size(); ++i) EXPECT_TRUE(draws(svgs[i])) << "chart " << i;
}

