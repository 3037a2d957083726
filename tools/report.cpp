// report: a stability report of one or more training runs.
//   report RUN [RUN ...] -o report.html [--max-checkpoints N] [--no-checkpoints]
//   report --text RUN [RUN ...] [--matrix wq|wk|wv|wo] [--top N]
// The HTML page is one self-contained file (inline CSS and SVG, no scripts, nothing
// fetched): the runs' configs, loss curves with spike events, spectral norms, attention
// statistics, delta drift, and weight distances between the runs' checkpoints (against the
// first run) — see tools/report/html_report.h; the inputs are the run files of
// docs/run_files.md, every one but metrics.jsonl optional. --text prints the spectral-norm
// table (largest heads first, sigma at the first and last hook step, growth). Nothing but
// the -o file is written.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <new>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tools/report/html_report.h"
#include "tools/report/run_data.h"
#include "tools/report/text_report.h"

namespace fs = std::filesystem;

namespace {

// Refuses an -o path that cannot be written, before any work: a missing or unwritable
// folder, an existing directory, or an existing file that is not a web page (so a typo
// cannot overwrite a run's files).
void check_output(const std::string& out) {
  const fs::path p(out);
  if (fs::is_directory(p)) st::fail("-o '", out, "' is a directory; give a file name such as report.html");
  if (fs::exists(p)) {
    const std::string ext = p.extension().string();
    if (ext != ".html" && ext != ".htm")
      st::fail("-o '", out, "' exists and is not an .html file; refusing to overwrite it");
    if (access(out.c_str(), W_OK) != 0) st::fail("cannot write -o '", out, "': ", std::strerror(errno));
    return;
  }
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir)) st::fail("cannot write -o '", out, "': folder '", dir.string(), "' does not exist");
  if (access(dir.c_str(), W_OK) != 0)
    st::fail("cannot write -o '", out, "': folder '", dir.string(), "' is not writable");
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char b[64];
  std::strftime(b, sizeof b, "generated %Y-%m-%d %H:%M", std::localtime(&t));
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"report: an HTML stability report of training runs, or the spectral-norm table (--text)"};
  std::vector<std::string> runs;
  std::string out, matrix = "wq";
  bool text = false, no_ckpt = false;
  int top = 0;
  size_t max_ckpt = 24;
  app.add_option("runs", runs, "run directories (the first is the reference for weight distances)")->required();
  app.add_option("-o,--output", out, "HTML file to write");
  app.add_flag("--text", text, "print the spectral-norm table of each run instead of writing HTML");
  app.add_option("--matrix", matrix, "--text: the per-head matrix")->capture_default_str()
      ->check(CLI::IsMember({"wq", "wk", "wv", "wo"}));
  app.add_option("--top", top, "--text: at most N heads (0: all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--max-checkpoints", max_ckpt, "checkpoint steps compared per pair of runs (evenly spaced)")
      ->capture_default_str()
      ->check(CLI::Range(2, 100000));
  app.add_flag("--no-checkpoints", no_ckpt, "do not read checkpoints (weight distances from wasserstein.csv only)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (text) {
      if (!out.empty()) st::fail("--text prints to the terminal; -o is for the HTML report");
      std::vector<st::report::RunData> data;
      for (const auto& r : runs) data.push_back(st::report::load_run(r));
      for (size_t i = 0; i < data.size(); ++i) {
        if (i) std::printf("\n");
        std::fputs(st::report::text_report(data[i], matrix, top).c_str(), stdout);
      }
      return 0;
    }
    if (out.empty()) st::fail("no output file: give -o report.html (or --text for the terminal table)");
    check_output(out);
    std::vector<st::report::RunData> data;
    for (const auto& r : runs) data.push_back(st::report::load_run(r));
    st::report::HtmlOptions opt;
    opt.max_checkpoint_pairs = max_ckpt;
    opt.compare_checkpoints = !no_ckpt;
    opt.generated = now_text();
    const std::string html = st::report::html_report(data, opt, stderr);
    {
      std::ofstream f(out, std::ios::binary | std::ios::trunc);
      if (!f) st::fail("cannot write -o '", out, "': ", std::strerror(errno));
      f << html;
      f.close();
      if (!f) st::fail("writing -o '", out, "' failed: ", std::strerror(errno));
    }
    std::printf("report: %s (%zu run%s, %.0f kB)\n", out.c_str(), data.size(), data.size() == 1 ? "" : "s",
                static_cast<double>(html.size()) / 1024.0);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "report: error: out of memory while reading the runs or building the"
                         " report (try --no-checkpoints, or fewer runs)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "report: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
