// The data-parallel tests' harness, shared by test_distributed.cpp and
// test_distributed_mpi.cpp: the scratch folder; in the CPU build a small byte-level config,
// `train` as one process or under mpirun with N ranks (output and wall time caught), a run
// trained and checked, and a run's metrics, losses and weights read back.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "test_util.h"

namespace st::dist_test {

namespace fs = std::filesystem;
using namespace st;
using st::test::slurp;

inline const fs::path& tmp_root() { return st::test::scratch_root("st_dist_test_"); }

#ifndef ST_DIST_GPU_TESTS

inline std::string text_file() { return st::test::pseudo_text_file(tmp_root() / "text.txt"); }

// A small byte-level model (118,528 parameters: two 64K-element ZeRO shards on 2 ranks).
inline std::string base_yaml(const std::string& out_dir, const std::string& prec, int accum,
                      const std::string& extra = "") {
  std::ostringstream y;
  y << "run: {name: d, out_dir: '" << out_dir << "', seed: 11, threads: 1}\n"
    << "model: {n_layer: 2, n_head: 2, n_embd: 64, max_seq_len: 32, vocab_size: 256}\n"
    << "data: {train_path: '" << text_file() << "', tokenizer: byte, val_fraction: 0.1}\n"
    << "train: {max_steps: 8, batch_size: 4, seq_len: 32, grad_accum_steps: " << accum
    << ", lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 2, ckpt_every: 4, keep_checkpoints: 0,"
    << " eval_every: 4, eval_batches: 3, log_every: 4, sample_tokens: 0,"
    << " grad_accum_mode: separate}\n"
    << "precision: {compute: " << prec << ", loss_scale_init: 1024}\n"
    << "hooks: {every: 0}\n"
    << "device: cpu\n"
    << extra;
  return y.str();
}

inline std::string write_yaml(const std::string& name, const std::string& text) {
  const fs::path p = tmp_root() / (name + ".yaml");
  std::ofstream(p) << text;
  return p.string();
}

struct Cmd {
  int code = -1;
  std::string out;  // stdout and stderr
  double seconds = 0;
};

inline Cmd sh(const std::string& cmd) {
  static int n = 0;
  const fs::path out = tmp_root() / ("out_" + std::to_string(n++) + ".txt");
  const auto t0 = std::chrono::steady_clock::now();
  Cmd c;
  c.code = st::test::sh(cmd + " >" + out.string() + " 2>&1");
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c.out = slurp(out);
  return c;
}

// OpenMPI's shared-memory transport copies between processes with CMA (process_vm_readv),
// which containers without ptrace rights refuse: plain copies through shared memory instead.
const std::string kContainerSafe = "--mca btl_vader_single_copy_mechanism none";

// `train` as one process, or under mpirun with `np` ranks (np 0: no mpirun).
inline Cmd train(int np, const std::string& config, const std::string& args = "",
          const std::string& env = "") {
  std::string cmd;
  if (np > 0) {
#ifdef ST_MPIEXEC
    cmd = std::string(ST_MPIEXEC) +
          " --allow-run-as-root --oversubscribe --bind-to none " + kContainerSafe +
          " -x OMP_NUM_THREADS=1 " + env +
          " -np " + std::to_string(np) + " ";
#else
    ADD_FAILURE() << "no mpirun";
#endif
  } else {
    cmd = "OMP_NUM_THREADS=1 ";
  }
  return sh(cmd + ST_TRAIN_BIN + " --config " + config + " " + args);
}

inline std::string dir_of(const std::string& name) { return (tmp_root() / name).string(); }

// One run: its config, then train it (np ranks); fails the test on a non-zero exit.
inline std::string run(const std::string& name, int np, const std::string& prec, int accum,
                const std::string& extra = "", const std::string& args = "") {
  const std::string cfg = write_yaml(name, base_yaml(dir_of(name), prec, accum, extra));
  const Cmd c = train(np, cfg, args);
  EXPECT_EQ(c.code, 0) << name << ":\n" << c.out;
  return dir_of(name);
}

// metrics.jsonl without the timing fields, one JSON text per line.
inline std::vector<std::string> metrics(const std::string& dir) {
  std::vector<std::string> lines;
  std::ifstream f(dir + "/metrics.jsonl");
  for (std::string l; std::getline(f, l);) {
    auto j = nlohmann::json::parse(l);
    j.erase("elapsed");
    j.erase("tokens_per_s");
    lines.push_back(j.dump());
  }
  return lines;
}

inline std::vector<double> losses(const std::string& dir) {
  std::vector<double> v;
  std::ifstream f(dir + "/metrics.jsonl");
  for (std::string l; std::getline(f, l);) {
    const auto j = nlohmann::json::parse(l);
    if (j.contains("loss")) v.push_back(j["loss"].get<double>());
  }
  return v;
}

inline std::vector<float> master_of(const std::string& ckpt) {
  const CheckpointState s = load_checkpoint(ckpt);
  std::vector<float> w(s.master.size() / 4);
  std::memcpy(w.data(), s.master.data(), s.master.size());
  return w;
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

#endif  // !ST_DIST_GPU_TESTS

}  // namespace st::dist_test
