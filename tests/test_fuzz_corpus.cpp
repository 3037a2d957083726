// The fuzzer's seed corpus (tests/fuzz/corpus/<target>/<entry>/), made from a tiny model:
// checkpoints (FP32, FP64, a ZeRO-1 rank file), config files, llm.c and safetensors
// weights, tokenizer files, token shards, run folders for `report` and `compare`, hook
// states. Written into the source tree by hand (the disabled FuzzCorpus.WriteCorpus; see
// test_fuzz.cpp's opening comment).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/loader.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "fuzz_harness.h"
#include "io/checkpoint.h"
#include "io/weights.h"
#include "model/gpt2.h"
#include "model_shapes.h"
#include "test_util.h"
#include "train/hooks.h"

namespace fs = std::filesystem;

namespace st {
namespace fuzz {

GPT2Config tiny_model() { return test::gpt2_shape(1, 2, 8, 8, 256); }

const char* const kTinyYaml =
    "run:\n  name: fuzz\n  seed: 7\nmodel:\n  n_layer: 1\n  n_head: 2\n  n_embd: 8\n"
    "  max_seq_len: 8\n  vocab_size: 256\ntrain:\n  max_steps: 3\n  batch_size: 2\n  seq_len: 8\n"
    "  lr: 1.0e-3\n  min_lr: 1.0e-4\n  warmup_steps: 1\nhooks:\n  every: 1\n  spike_z: 4.5\n"
    "precision:\n  compute: fp32\ndevice: cpu\n";

}  // namespace fuzz

using namespace fuzz;
namespace {

std::string bytes_of(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
std::vector<uint8_t> u8(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string saved_checkpoint(const CheckpointState& s, const fs::path& tmp) {
  save_checkpoint(tmp.string(), s);
  return test::slurp(tmp);
}

std::map<std::string, std::vector<std::pair<std::string, Bundle>>> make_corpus(const fs::path& tmp) {
  std::map<std::string, std::vector<std::pair<std::string, Bundle>>> c;
  const GPT2Config mc = [] {
    GPT2Config m = tiny_model();
    m.padded_vocab_size = m.vp();
    return m;
  }();
  const int64_t np = num_parameters(mc);
  std::vector<float> params(np);
  Rng r(5);
  for (auto& p : params) p = static_cast<float>(r.uniform() - 0.5);

  // checkpoint: a single-process FP32 file, an FP64 one, a ZeRO-1 rank file.
  CheckpointState s;
  s.config_yaml = kTinyYaml;
  s.step = 3;
  s.adam_step = 3;
  set_model_config(s, mc);
  s.compute = "fp32";
  s.master = u8(bytes_of(params));
  s.m = s.master;
  s.v = s.master;
  s.rng_state = Rng(5).state().to_bytes();
  s.data_state = DataLoader::State{1, 2}.to_bytes();
  s.hooks_state = {1, 0, 0, 0};
  c["checkpoint"].push_back({"fp32", {{"ckpt_00000003.bin", saved_checkpoint(s, tmp / "c.bin")}}});
  {
    CheckpointState d = s;
    d.compute = "fp64";
    d.config_yaml.replace(d.config_yaml.find("compute: fp32"), 13, "compute: fp64");
    d.master_elem_bytes = 8;
    std::vector<double> p64(params.begin(), params.end());
    d.master.assign(reinterpret_cast<const uint8_t*>(p64.data()),
                    reinterpret_cast<const uint8_t*>(p64.data() + p64.size()));
    d.m = d.master;
    d.v = d.master;
    c["checkpoint"].push_back({"fp64", {{"ckpt_00000003.bin", saved_checkpoint(d, tmp / "c.bin")}}});
  }
  {
    CheckpointState z = s;
    z.dist_world = 2;
    z.optim_shards = 2;
    z.shard_rank = 1;
    z.shard_begin = np / 2;
    z.shard_end = np;
    z.master.resize(4 * (np - np / 2));
    z.m = z.master;
    z.v = z.master;
    c["checkpoint"].push_back(
        {"zero1_rank1", {{"ckpt_00000003.rank1.bin", saved_checkpoint(z, tmp / "c.bin")}}});
  }

  // config: the repository's configs and the tiny one.
  for (const char* name : {"tiny_shakespeare_bytes", "gpt2_small"})
    c["config"].push_back(
        {name, {{"config.yaml", test::slurp(fs::path(ST_SOURCE_DIR) / "configs" / (std::string(name) + ".yaml"))}}});
  c["config"].push_back({"tiny", {{"config.yaml", kTinyYaml}}});
  c["config"].push_back(
      {"per_layer", {{"config.yaml", std::string(kTinyYaml) +
                                         "attention:\n  backend: flash\n  block_q: 4\n  block_k: 4\n"
                                         "  layer_backends: \"0:stabilized_flash\"\n"
                                         "  fp32_out_heads: \"0.1,0.0\"\n"
                                         "dist:\n  backend: none\n  timeout_s: 60\n"}}});

  // llm.c and safetensors weights of the tiny model.
  ModelWeights w{mc, params};
  for (bool bf16 : {false, true}) {
    save_llmc((tmp / "m.bin").string(), w, bf16);
    c["llmc"].push_back({bf16 ? "bf16" : "fp32", {{"model.bin", test::slurp(tmp / "m.bin")}}});
  }
  for (const char* dt : {"F32", "BF16"}) {
    save_safetensors((tmp / "m.st").string(), w, dt);
    c["safetensors"].push_back({dt, {{"model.safetensors", test::slurp(tmp / "m.st")}}});
  }

  // tokenizer: the 256 byte tokens, a few merges, <|endoftext|>.
  {
    const auto b2u = gpt2_byte_to_unicode();
    auto key = [&](int b) {
      std::string k;
      const uint32_t cp = b2u[b];
      if (cp < 0x80) k.push_back(static_cast<char>(cp));
      else k += {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
      return k;
    };
    auto esc = [](const std::string& k) {
      std::string o;
      for (char ch : k) {
        if (ch == '"' || ch == '\\') o += '\\';
        o += ch;
      }
      return o;
    };
    std::string enc = "{";
    int id = 0;
    for (int b = 0; b < 256; ++b) enc += (b ? ", \"" : "\"") + esc(key(b)) + "\": " + std::to_string(id++);
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"t", "h"}, {"h", "e"}, {"th", "e"}, {key(' '), "t"}, {key(' ') + "t", "he"},
        {"o", "t"}, {"e", "r"}};
    for (const auto& [a, b] : merges) enc += ", \"" + esc(a + b) + "\": " + std::to_string(id++);
    enc += ", \"<|endoftext|>\": " + std::to_string(id++) + "}";
    std::string bpe = "#version: 0.2\n";
    for (const auto& [a, b] : merges) bpe += a + " " + b + "\n";
    c["tokenizer"].push_back({"mini", {{"encoder.json", enc}, {"vocab.bpe", bpe}}});
  }

  // token shards: 100 tokens, and an empty one.
  {
    std::vector<uint16_t> toks(100);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = uint16_t((i * 37) % 300);
    write_token_shard((tmp / "s.bin").string(), toks.data(), int64_t(toks.size()));
    c["shards"].push_back({"tokens100", {{"shard.bin", test::slurp(tmp / "s.bin")}}});
    write_token_shard((tmp / "s.bin").string(), toks.data(), 0);
    c["shards"].push_back({"empty", {{"shard.bin", test::slurp(tmp / "s.bin")}}});
  }

  // report: a run directory's text files (docs/run_files.md), two short runs.
  for (int v = 0; v < 2; ++v) {
    Bundle b;
    std::string m, spec = "step,layer,head,matrix,sigma,iters,converged\n",
                    attn = "step,layer,head,stat,value\n",
                    drift = "step,layer,head,delta_drift,delta_drift_cum,delta_abs_err,dwq_err_norm,"
                            "dwq_rel_err,dwq_cos_prev\n",
                    grad = "step,tensor,layer,head,norm\n",
                    wass = "step,tensor,layer,head,w1,w1_normalized,max_abs_diff\n", ev;
    for (int step = 1; step <= 4; ++step) {
      const double loss = 4.5 - 0.25 * step - 0.01 * v;
      m += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) +
           ",\"lr\":0.001,\"grad_norm\":1.25,\"tokens_per_s\":1000.5,\"elapsed\":0." +
           std::to_string(step) + (v ? ",\"loss_scale\":65536.0,\"skipped\":false" : "") + "}\n";
      if (step % 2 == 0) {
        m += "{\"step\":" + std::to_string(step) + ",\"val_loss\":" + std::to_string(loss + 0.1) +
             ",\"elapsed\":0.5}\n";
        m += "{\"step\":" + std::to_string(step) + ",\"checkpoint\":\"ckpt_0000000" +
             std::to_string(step) + ".bin\",\"weights_sha256\":\"ab12\"}\n";
      }
      for (int h = 0; h < 2; ++h) {
        for (const char* mat : {"wq", "wk", "wv", "wo"})
          spec += std::to_string(step) + ",0," + std::to_string(h) + "," + mat + "," +
                  std::to_string(1.0 + 0.1 * step + h) + ",12,1\n";
        for (const char* st : {"max_logit", "tied_row_frac", "p_one", "p_tilde_one", "entropy"})
          attn += std::to_string(step) + ",0," + std::to_string(h) + "," + st + "," +
                  std::to_string(0.5 * step + h) + "\n";
        drift += std::to_string(step) + ",0," + std::to_string(h) +
                 ",1e-07,3e-07,2e-08,0.001,0.0002,0.99\n";
        wass += std::to_string(step) + ",wq,0," + std::to_string(h) + ",0.0001,0.01,0.002\n";
      }
      spec += std::to_string(step) + ",,,wte,2.5,30,1\n" + std::to_string(step) + ",0,,qkvw,1.75,20,0\n";
      grad += std::to_string(step) + ",wte,,,0.5\n" + std::to_string(step) + ",qkvw,0,,0.25\n";
    }
    ev = "{\"step\":3,\"event\":\"spike\",\"metric\":\"loss\",\"value\":9.5,\"mean\":4.0,"
         "\"std\":0.5,\"z\":11.0,\"action\":\"log\"}\n"
         "{\"step\":4,\"event\":\"overflow\",\"loss_scale\":32768.0}\n";
    b["metrics.jsonl"] = m;
    b["config.yaml"] = kTinyYaml;
    b["spectral.csv"] = spec;
    b["attn_stats.csv"] = attn;
    b["delta_drift.csv"] = drift;
    b["grad_norms.csv"] = grad;
    b["wasserstein.csv"] = wass;
    b["events.jsonl"] = ev;
    c["report"].push_back({v ? "run_fp16" : "run_fp32", b});
    // compare: the same run's metrics.jsonl and config.yaml.
    c["compare"].push_back({v ? "run_b" : "run_a", {{"metrics.jsonl", m}, {"config.yaml", kTinyYaml}}});
    // hooks: the same hook files, the reference run's config and a hooks_state blob.
    Bundle h;
    for (const char* f : {"spectral.csv", "attn_stats.csv", "delta_drift.csv", "grad_norms.csv",
                          "wasserstein.csv", "events.jsonl"})
      h[f] = b[f];
    h["ref_config.yaml"] = kTinyYaml;
    {
      const fs::path rd = tmp / "hooks_run", ref = tmp / "hooks_ref";
      fs::create_directories(rd);
      fs::create_directories(ref);
      std::ofstream(ref / "config.yaml") << kTinyYaml;
      auto hk = tiny_hooks(rd, ref);
      if (v) hk->at_start();  // power-iteration vectors in the state
      const std::vector<uint8_t> st = hk->state();
      h["hooks_state.bin"] = std::string(st.begin(), st.end());
    }
    c["hooks"].push_back({v ? "warm" : "cold", h});
  }
  return c;
}

// Written into the source tree (run by hand; see the top of this file).
TEST(FuzzCorpus, DISABLED_WriteCorpus) {
  const fs::path tmp = test::make_scratch_dir("st_fuzz_corpus_");
  for (const auto& [target, entries] : make_corpus(tmp)) {
    const fs::path d = fs::path(ST_FUZZ_CORPUS_DIR) / target;
    fs::remove_all(d);
    for (const auto& [name, b] : entries) write_bundle(d / name, b);
  }
}

}  // namespace
}  // namespace st
