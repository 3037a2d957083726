// The `compare` tool's test harness, shared by test_compare.cpp (the library) and
// test_compare_tool.cpp (the tool end to end): the scratch folder, running compare and
// train, tiny runs trained once per test process, and compare's CSV read back.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/slices.h"
#include "analysis/weight_distance.h"
#include "io/checkpoint.h"
#include "model_shapes.h"
#include "test_util.h"

namespace st::compare_test {

namespace fs = std::filesystem;
using st::test::slurp;

inline const fs::path& tmp_root() { return st::test::scratch_root("st_compare_test_"); }

using st::test::Cmd;
inline Cmd run_cmd(const std::string& cmd) { return st::test::run_cmd(cmd, tmp_root()); }

inline Cmd compare(const std::string& args) {
  return run_cmd(std::string(ST_COMPARE_BIN) + " " + args);
}

// A tiny byte-level run (about 0.2 s): 20 steps, checkpoints at 10 and 20, evaluations at 10
// and 20. `sets` are train --set overrides. Trained once per test process (per name).
inline std::string train_run(const std::string& name, const std::string& sets = "") {
  const fs::path dir = tmp_root() / name;
  static std::set<std::string> trained;
  if (!trained.insert(name).second) return dir.string();
  const fs::path cfg = tmp_root() / "base.yaml";
  if (!fs::exists(cfg)) {
    std::ofstream(cfg)
        << "run: {name: t, out_dir: unused, seed: 7, threads: 1}\n"
        << "model: {n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 32, vocab_size: 256}\n"
        << "data: {train_path: '" ST_SHARED_DATA_DIR "/tinyshakespeare.txt', tokenizer: byte,"
        << " val_fraction: 0.1}\n"
        << "train: {max_steps: 20, batch_size: 4, seq_len: 32, lr: 3.0e-3, min_lr: 3.0e-4,"
        << " warmup_steps: 3, ckpt_every: 10, keep_checkpoints: 0, eval_every: 10,"
        << " eval_batches: 2, log_every: 10, sample_tokens: 0}\n"
        << "device: cpu\n";
  }
  const Cmd c = run_cmd(std::string(ST_TRAIN_BIN) + " --config " + cfg.string() +
                        " --set run.out_dir=" + dir.string() + " " + sets);
  EXPECT_EQ(c.code, 0) << "train " << name << " failed: " << c.err;
  return dir.string();
}

struct CsvRow {
  std::string run_a, run_b, pairing, tensor;
  int64_t step = 0, step_a = 0, step_b = 0;
  int layer = -1, head = -1;
  double w1 = 0, w1n = 0, mad = 0;
};

inline std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> f;
  std::stringstream ss(line);
  for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
  if (!line.empty() && line.back() == ',') f.push_back("");
  return f;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> v;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) v.push_back(l);
  return v;
}

inline std::vector<CsvRow> read_compare_csv(const fs::path& p) {
  const auto lines = lines_of(slurp(p));
  EXPECT_FALSE(lines.empty()) << p;
  if (lines.empty()) return {};
  EXPECT_EQ(lines[0], "run_a,run_b,step,step_a,step_b,pairing,tensor,layer,head,w1,"
                      "w1_normalized,max_abs_diff");
  std::vector<CsvRow> rows;
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto f = split(lines[i]);
    EXPECT_EQ(f.size(), 12u) << lines[i];
    if (f.size() != 12) continue;
    CsvRow r;
    r.run_a = f[0];
    r.run_b = f[1];
    r.step = std::stoll(f[2]);
    r.step_a = std::stoll(f[3]);
    r.step_b = std::stoll(f[4]);
    r.pairing = f[5];
    r.tensor = f[6];
    // Integers always: -1 = not per layer / head (no empty fields, so pandas reads int64).
    EXPECT_FALSE(f[7].empty() || f[8].empty()) << lines[i];
    r.layer = std::stoi(f[7]);
    r.head = std::stoi(f[8]);
    r.w1 = std::stod(f[9]);
    r.w1n = std::stod(f[10]);
    r.mad = std::stod(f[11]);
    EXPECT_EQ(r.step, r.step_a) << lines[i];
    EXPECT_EQ(r.pairing, r.step_a == r.step_b ? "exact" : "nearest") << lines[i];
    rows.push_back(r);
  }
  return rows;
}

// The rows of one pair of runs at run A's step, in file order.
inline std::vector<CsvRow> rows_at(const std::vector<CsvRow>& rows, const std::string& run_b,
                            int64_t step_a) {
  std::vector<CsvRow> out;
  for (const auto& r : rows)
    if (r.run_b == run_b && r.step_a == step_a) out.push_back(r);
  return out;
}

// Every row equals weight_distances computed here, directly, between the two checkpoint files.
inline void expect_rows_match_checkpoints(const std::vector<CsvRow>& rows, const fs::path& fa,
                                   const fs::path& fb) {
  const CheckpointWeights wa = load_checkpoint_weights(fa.string());
  const CheckpointWeights wb = load_checkpoint_weights(fb.string());
  const auto want = weight_distances(wa.config, wa.master, wb.master);
  ASSERT_EQ(rows.size(), want.size()) << fa << " vs " << fb;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(rows[i].tensor, want[i].tensor);
    EXPECT_EQ(rows[i].layer, want[i].layer);
    EXPECT_EQ(rows[i].head, want[i].head);
    EXPECT_EQ(rows[i].w1, want[i].w1) << rows[i].tensor;  // shortest round-trip: exact
    EXPECT_EQ(rows[i].w1n, want[i].w1_normalized) << rows[i].tensor;
    EXPECT_EQ(rows[i].mad, want[i].max_abs_diff) << rows[i].tensor;
  }
}

inline std::string ckpt(const std::string& run, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt_%08lld.bin", (long long)step);
  return (fs::path(run) / name).string();
}

inline size_t slices_per_step() {
  return weight_slices(test::gpt2_shape(2, 2, 32, 32, 256), true).size();
}

// An error case: non-zero exit, exactly one line on stderr, nothing written under `out_dir`.
inline void expect_one_line_error(const Cmd& c, const fs::path& out_dir) {
  EXPECT_NE(c.code, 0);
  EXPECT_EQ(std::count(c.err.begin(), c.err.end(), '\n'), 1) << c.err;
  EXPECT_EQ(c.err.rfind("compare: ", 0), 0u) << c.err;
  EXPECT_TRUE(fs::is_empty(out_dir)) << "an output was written on error";
}

inline fs::path fresh_out_dir(const std::string& name) {
  const fs::path d = tmp_root() / ("out_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace st::compare_test
