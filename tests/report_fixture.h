// `report`'s test harness, shared by test_report.cpp and test_report_bad_input.cpp: the
// scratch folder, running `report` and `train`, two real tiny runs trained once per test
// process (run_a with hook files written here, run_b), hook files with chosen values, the
// --text table read back, and a snapshot of a folder (to see that nothing else was written).
#pragma once
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

namespace st::report_test {

namespace fs = std::filesystem;
using st::test::sh;
using st::test::slurp;
using st::test::dump_panels;
using st::test::expect_clean;
using st::test::page_data;
using st::test::Render;
using st::test::render_page;


inline const fs::path& tmp_root() { return st::test::scratch_root("st_report_test_"); }

using st::test::Cmd;
inline Cmd run(const std::string& cmdline) { return st::test::run_cmd(cmdline, tmp_root()); }

inline Cmd report(const std::string& args) { return run(std::string(ST_REPORT_BIN) + " " + args); }

inline std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

inline std::string tiny_yaml(const fs::path& out_dir, const std::string& name, int seed,
                             const std::string& prec) {
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
inline fs::path train_run(const std::string& name, int seed, const std::string& prec,
                          const std::string& extra = "") {
  const fs::path dir = tmp_root() / name;
  if (fs::exists(dir / "metrics.jsonl")) return dir;
  const fs::path cfg = tmp_root() / (name + ".yaml");
  std::ofstream(cfg) << tiny_yaml(dir, name, seed, prec);
  const Cmd r = run(std::string(ST_TRAIN_BIN) + " --config " + q(cfg) + " " + extra);
  EXPECT_EQ(r.code, 0) << "train failed: " << r.err;
  return dir;
}

inline std::string num(double v) {
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
inline void write_hook_files(const fs::path& dir, bool truncated_tail,
                             const std::string& none = "-1") {
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
inline fs::path run_a() {
  static const fs::path d = [] {
    const fs::path p = train_run("run_a", 1, "bf16",
                                 "--set hooks.every=0 --set attention.backend=flash "
                                 "--set attention.o_tilde_bits=3");
    write_hook_files(p, true);
    return p;
  }();
  return d;
}
inline fs::path run_b() {
  static const fs::path d = train_run("run_b", 2, "fp32", "--set hooks.every=0");
  return d;
}

// The data rows of the table that follows the line starting with `title` in --text output.
inline std::vector<std::vector<std::string>> table_after(const std::string& out,
                                                        const std::string& title) {
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

inline size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// Every file under `dir` with its bytes.
inline std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[e.path().string()] = slurp(e.path());
  return m;
}

}  // namespace st::report_test
