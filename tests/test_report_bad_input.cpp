// `report` on bad input: one-line errors naming the path, unreadable metrics lines said on
// the console, corrupt hook files, a config or metrics file that is a folder; and
// `RealHooks`, a real run with the trainer's hooks every 5 steps, reported and rendered.
// (The --text table, CSV reading and the page: test_report.cpp; the shared harness:
// report_fixture.h.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <tuple>

#include "report_fixture.h"
#include "report_page.h"
#include "apps/report/html_report.h"
#include "apps/report/run_data.h"

using namespace st::report_test;

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
