// report: a stability report of one or more training runs.
//   report RUN [RUN ...] -o report.html [--reference RUN] [--watch SECONDS]
//          [--max-checkpoints N] [--no-checkpoints]
//   report --text RUN [RUN ...] [--matrix wq|wk|wv|wo] [--top N]
// The HTML page is one offline file (apps/report/html_report.h): the runs' data as JSON,
// drawn by the page's script with the inlined uPlot. Everything is compared against the
// reference run (--reference, default the first): Δloss, weight distances from the
// checkpoints. --watch rewrites the page every SECONDS (atomically) and the page reloads
// itself, keeping its settings, for a run in progress. The inputs are the run files of
// docs/run_files.md, every one but metrics.jsonl optional. --text prints the spectral-norm
// table (largest heads first, sigma at the first and last hook step, growth). Nothing but
// the -o file is written.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include <cerrno>
#include <cstdio>
#include <new>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "apps/report/html_report.h"
#include "apps/report/run_data.h"
#include "apps/report/text_report.h"

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

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

// The reference run's index: a directory given as a run (same path once made canonical),
// or a run's name (run.name, else its directory's name).
size_t reference_index(const std::vector<std::string>& dirs, const std::vector<st::report::RunData>& runs,
                       const std::string& ref) {
  if (ref.empty()) return 0;
  std::error_code ec;
  const fs::path want = fs::weakly_canonical(ref, ec);
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::error_code e2;
    if (!ec && fs::weakly_canonical(dirs[i], e2) == want && !e2) return i;
  }
  std::vector<size_t> by_name;
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].name == ref) by_name.push_back(i);
  if (by_name.size() == 1) return by_name[0];
  if (by_name.size() > 1) st::fail("--reference '", ref, "' names ", by_name.size(), " runs; give its directory");
  std::string given;
  for (const auto& d : dirs) given += (given.empty() ? "" : ", ") + d;
  st::fail("--reference '", ref, "' is none of the runs given (", given, "); give one of their directories or names");
}

// Writes `text` to `out` through a temporary file in the same folder and a rename, so a
// browser reloading the page never reads half of it.
void write_atomically(const std::string& out, const std::string& text) {
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) st::fail("cannot write '", tmp, "': ", std::strerror(errno));
    f << text;
    f.close();
    if (!f) st::fail("writing '", tmp, "' failed: ", std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) {
    fs::remove(tmp);
    st::fail("cannot replace -o '", out, "': ", ec.message());
  }
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char b[64];
  std::strftime(b, sizeof b, "generated %Y-%m-%d %H:%M", std::localtime(&t));
  return b;
}

}  // namespace

// The runs' skipped lines on the console (the page has them too), and a run with no
// readable metrics line is an error -- except while --watch waits for a run to start.
void check_readable(const std::vector<st::report::RunData>& data, bool watching) {
  for (const auto& r : data)
    for (const auto& s : r.skipped_lines) std::fprintf(stderr, "report: warning: %s\n", s.c_str());
  for (const auto& r : data) {
    if (r.metrics_records > 0) continue;
    const std::string why = "'" + r.dir + "/metrics.jsonl' has no readable line" +
                            (r.metrics_note.empty() ? " (empty: the run has not logged a step yet)"
                                                    : " (" + r.metrics_note + ")");
    if (!watching) st::fail(why, "; give a run directory train wrote, or --watch to wait for it");
    std::fprintf(stderr, "report: warning: %s; watching\n", why.c_str());
  }
}

int main(int argc, char** argv) {
  CLI::App app{"report: an HTML stability report of training runs, or the spectral-norm table (--text)"};
  std::vector<std::string> runs;
  std::string out, matrix = "wq", reference;
  bool text = false, no_ckpt = false;
  int top = 0, watch = 0;
  size_t max_ckpt = 24;
  app.add_option("runs", runs, "run directories")->required();
  app.add_option("-o,--output", out, "HTML file to write");
  app.add_option("--reference", reference,
                 "the run the others are compared against (Δloss, weight distances): one of the run directories "
                 "or run names given; default the first");
  app.add_option("--watch", watch,
                 "rewrite the page every SECONDS until interrupted; the page reloads itself (a run in progress)")
      ->check(CLI::Range(1, 86400));
  app.add_flag("--text", text, "print the spectral-norm table of each run instead of writing HTML");
  app.add_option("--matrix", matrix, "--text: the per-head matrix")->capture_default_str()
      ->check(CLI::IsMember({"wq", "wk", "wv", "wo"}));
  app.add_option("--top", top, "--text: at most N heads (0: all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--max-checkpoints", max_ckpt, "checkpoint pairs compared per run (evenly spaced)")
      ->capture_default_str()
      ->check(CLI::Range(2, 100000));
  app.add_flag("--no-checkpoints", no_ckpt, "do not read checkpoints (weight distances from wasserstein.csv only)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (text) {
      if (!out.empty()) st::fail("--text prints to the terminal; -o is for the HTML report");
      if (watch) st::fail("--watch rewrites an HTML report; it does not go with --text");
      std::vector<st::report::RunData> data;
      for (const auto& r : runs) data.push_back(st::report::load_run(r));
      check_readable(data, false);
      for (size_t i = 0; i < data.size(); ++i) {
        if (i) std::printf("\n");
        std::fputs(st::report::text_report(data[i], matrix, top).c_str(), stdout);
      }
      return 0;
    }
    if (out.empty()) st::fail("no output file: give -o report.html (or --text for the terminal table)");
    check_output(out);
    if (watch) {
      std::signal(SIGINT, on_signal);
      std::signal(SIGTERM, on_signal);
    }
    for (int round = 0;; ++round) {
      std::vector<st::report::RunData> data;
      for (const auto& r : runs) data.push_back(st::report::load_run(r));
      if (round == 0) check_readable(data, watch > 0);
      st::report::HtmlOptions opt;
      opt.reference = reference_index(runs, data, reference);
      opt.max_checkpoint_pairs = max_ckpt;
      opt.compare_checkpoints = !no_ckpt;
      opt.generated = now_text();
      opt.refresh_s = watch;
      const std::string html = st::report::html_report(data, opt, round == 0 ? stderr : nullptr);
      write_atomically(out, html);
      const std::string every = watch ? "; rewritten every " + std::to_string(watch) + " s until Ctrl-C" : "";
      if (round == 0)
        std::printf("report: %s (%zu run%s, reference %s, %.0f kB)%s\n", out.c_str(), data.size(),
                    data.size() == 1 ? "" : "s", data[opt.reference].name.c_str(),
                    static_cast<double>(html.size()) / 1024.0, every.c_str());
      std::fflush(stdout);
      if (!watch) break;
      for (int t = 0; t < watch * 10 && !g_stop; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (g_stop) {
        std::printf("report: stopped watching; %s is the page of %s\n", out.c_str(), now_text().c_str());
        break;
      }
    }
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
