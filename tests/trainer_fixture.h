// The trainer tests' harness, shared by test_trainer.cpp and test_trainer_runs.cpp: the
// scratch folder, a tiny byte-level config (2 layers, 20 steps, checkpoints every 5) in any
// precision, quiet training options, and the `train` binary run with its output caught.
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_util.h"
#include "train/config.h"
#include "train/trainer.h"

namespace st::trainer_test {

namespace fs = std::filesystem;
using namespace st;

using st::test::slurp;

inline const fs::path& tmp_root() { return st::test::scratch_root("st_trainer_test_"); }

// A deterministic pseudo-text of ~40 KB (words from a small vocabulary).
inline std::string text_file() { return st::test::pseudo_text_file(tmp_root() / "text.txt"); }

inline std::string base_yaml(const std::string& out_dir, const std::string& prec) {
  std::ostringstream y;
  y << "run: {name: t, out_dir: '" << out_dir << "', seed: 7}\n"
    << "model: {n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 16, vocab_size: 256}\n"
    << "data: {train_path: '" << text_file() << "', tokenizer: byte, val_fraction: 0.1}\n"
    << "train: {max_steps: 20, batch_size: 4, seq_len: 16, grad_accum_steps: 2, lr: 3.0e-3,"
    << " min_lr: 3.0e-4, warmup_steps: 3, ckpt_every: 5, keep_checkpoints: 0, eval_every: 10,"
    << " eval_batches: 2, log_every: 5, sample_tokens: 0}\n"
    << "precision: {compute: " << prec << ", loss_scale_init: 1024}\n"
    << "device: cpu\n";
  return y.str();
}

inline Config config(const std::string& name, const std::string& prec) {
  return parse_config(base_yaml((tmp_root() / name).string(), prec), name + ".yaml");
}

inline TrainOptions quiet() {
  TrainOptions o;
  o.console = false;
  return o;
}


using st::test::Cmd;

// Runs the train binary; its exit code, stdout and stderr.
inline Cmd train_cmd(const std::string& args) {
  return st::test::run_cmd(std::string(ST_TRAIN_BIN) + " " + args, tmp_root());
}

inline std::string write_yaml(const std::string& name, const std::string& text) {
  const fs::path p = tmp_root() / name;
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace st::trainer_test
