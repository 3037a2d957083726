// A safetensors export read by PyTorch: `train` trains a small GPT-2 on GPT-2 BPE shards
// (FP32), `export_weights` writes model.safetensors with Hugging Face names, and
// tests/torch/gpt2_safetensors_loss.py (Debian python3-torch, its own GPT-2 forward on the
// HF tensors) computes the loss of the same validation batches. It must match train's own
// final val_loss to 1e-4 relative. Label `slow`: python3-torch is not in CI's packages.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"

namespace fs = std::filesystem;

using st::test::sh;
using st::test::slurp;

TEST(SafetensorsTorch, ExportLossMatchesTrainEvaluation) {
  ASSERT_EQ(sh("/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null"), 0)
      << "needs /usr/bin/python3 with torch and numpy (Debian: apt-get install python3-torch)";
  const fs::path dir = fs::temp_directory_path() / ("st_torch_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string run = (dir / "run").string(), shards = (dir / "shards").string();
  const int B = 4, T = 64, N = 3, H = 4;
  std::ostringstream y;
  y << "run: {name: torch, out_dir: '" << run << "', seed: 11, threads: 1}\n"
    << "model: {n_layer: 2, n_head: " << H << ", n_embd: 64, max_seq_len: 64, vocab_size: 50257}\n"
    << "data: {train_path: '" << shards << "/ts_train_*.bin', val_path: '" << shards
    << "/ts_val_*.bin', tokenizer: gpt2, tokenizer_dir: '" ST_SHARED_DATA_DIR
       "/gpt2-tokenizer', prepare_from: '" ST_SHARED_DATA_DIR "/tinyshakespeare.txt'}\n"
    << "train: {max_steps: 40, batch_size: " << B << ", seq_len: " << T
    << ", lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5, eval_every: 0, eval_batches: " << N
    << ", sample_tokens: 0, log_every: 20}\n"
    << "precision: {compute: fp32}\ndevice: cpu\n";
  const std::string cfg = (dir / "c.yaml").string();
  std::ofstream(cfg) << y.str();
  ASSERT_EQ(sh(std::string(ST_TRAIN_BIN) + " --config " + cfg + " >/dev/null"), 0);
  double val = 0;
  std::ifstream m(run + "/metrics.jsonl");
  for (std::string l; std::getline(m, l);) {
    const auto j = nlohmann::json::parse(l);
    if (j.contains("val_loss")) val = j["val_loss"].get<double>();
  }
  ASSERT_GT(val, 0);
  const std::string hf = (dir / "hf").string();
  ASSERT_EQ(sh(std::string(ST_EXPORT_BIN) + " --input " + run + " --format safetensors --output " + hf + " >/dev/null"), 0);
  const std::string out = (dir / "torch.json").string();
  ASSERT_EQ(sh("/usr/bin/python3 " ST_TORCH_SCRIPT " " + hf + "/model.safetensors " + shards +
               "/ts_val_000000.bin " + std::to_string(B) + " " + std::to_string(T) + " " +
               std::to_string(N) + " " + std::to_string(H) + " >" + out),
            0);
  const auto j = nlohmann::json::parse(slurp(out));
  const double t32 = j["loss_fp32"], t64 = j["loss_fp64"];
  const double rel32 = std::abs(t32 - val) / val, rel64 = std::abs(t64 - val) / val;
  std::printf("  train val_loss %.9f | torch fp32 %.9f (rel diff %.2e) | torch fp64 %.9f (rel diff %.2e)\n",
              val, t32, rel32, t64, rel64);
  EXPECT_LT(rel32, 1e-4);
  EXPECT_LT(rel64, 1e-4);
  fs::remove_all(dir);
}
