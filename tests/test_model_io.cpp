// Model weight files: llm.c version 3/5 round trips (header, order, sizes), safetensors with
// Hugging Face GPT-2 names and Conv1D (in, out) layouts, bad files refused naming the file,
// and `train` starting from each format (model.init_from), including GPT-2 BPE shards with
// an exact resume.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/weights.h"
#include "train/config.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace st;

using st::test::slurp;
using st::test::sh;

namespace {

const fs::path& tmp() { return st::test::scratch_root("st_io_"); }

using st::test::error_of;

// Odd sizes; random values everywhere, padded vocabulary rows included.
ModelWeights random_weights(uint64_t seed) {
  ModelWeights w;
  w.config.n_layer = 2;
  w.config.n_head = 3;
  w.config.n_embd = 24;
  w.config.max_seq_len = 17;
  w.config.vocab_size = 301;
  w.config.padded_vocab_size = w.config.vp();
  Rng r(seed);
  w.params.resize(static_cast<size_t>(num_parameters(w.config)));
  for (float& v : w.params) v = static_cast<float>(r.normal());
  return w;
}

int64_t offset_of(const GPT2Config& c, int id) {
  const auto s = param_shapes(c);
  int64_t o = 0;
  for (int i = 0; i < id; ++i) o += shape_numel(s[i]);
  return o;
}

}  // namespace

TEST(Llmc, Fp32RoundTripIsExact) {
  const ModelWeights w = random_weights(1);
  const std::string p = (tmp() / "m3.bin").string();
  save_llmc(p, w, false);
  const std::string b = slurp(p);
  ASSERT_EQ(b.size(), 1024 + w.params.size() * 4);
  int32_t h[256];
  std::memcpy(h, b.data(), 1024);
  EXPECT_EQ(h[0], 20240326);
  EXPECT_EQ(h[1], 3);
  EXPECT_EQ(h[2], 17);   // maxT
  EXPECT_EQ(h[3], 301);  // V
  EXPECT_EQ(h[4], 2);    // L
  EXPECT_EQ(h[5], 3);    // NH
  EXPECT_EQ(h[6], 24);   // C
  EXPECT_EQ(h[7], 384);  // padded V
  // Tensor order: wte first, then wpe, ..., lnfb last (llm.c's order).
  float first, last;
  std::memcpy(&first, b.data() + 1024, 4);
  std::memcpy(&last, b.data() + b.size() - 4, 4);
  EXPECT_EQ(first, w.params.front());
  EXPECT_EQ(last, w.params.back());
  const ModelWeights r = load_llmc(p);
  EXPECT_EQ(r.config.n_layer, 2);
  EXPECT_EQ(r.config.n_head, 3);
  EXPECT_EQ(r.config.n_embd, 24);
  EXPECT_EQ(r.config.max_seq_len, 17);
  EXPECT_EQ(r.config.vocab_size, 301);
  EXPECT_EQ(r.config.vp(), 384);
  EXPECT_EQ(r.params, w.params);
  EXPECT_EQ(load_weights(p).params, w.params);
}

TEST(Llmc, Bf16RoundTripRoundsOnceThenIsExact) {
  const ModelWeights w = random_weights(2);
  const std::string p = (tmp() / "m5.bin").string();
  save_llmc(p, w, true);
  EXPECT_EQ(slurp(p).size(), 1024 + w.params.size() * 2);
  const ModelWeights r = load_llmc(p);
  ASSERT_EQ(r.params.size(), w.params.size());
  for (size_t i = 0; i < w.params.size(); ++i) ASSERT_EQ(r.params[i], round_bf16(w.params[i])) << i;
  const std::string p2 = (tmp() / "m5b.bin").string();
  save_llmc(p2, r, true);
  EXPECT_EQ(slurp(p2), slurp(p));
}

TEST(Llmc, BadFilesAreRefused) {
  const ModelWeights w = random_weights(3);
  const std::string p = (tmp() / "good.bin").string();
  save_llmc(p, w, false);
  const std::string g = slurp(p);
  auto put = [&](const std::string& name, const std::string& bytes) {
    const std::string q = (tmp() / name).string();
    std::ofstream(q, std::ios::binary) << bytes;
    return q;
  };
  std::string v7 = g;
  v7[4] = 7;
  const struct {
    std::string path, expect;
  } cases[] = {
      {put("trunc.bin", g.substr(0, g.size() - 10)), "truncated"},
      {put("short.bin", g.substr(0, 100)), "1024-byte header"},
      {put("magic.bin", "ABCD" + g.substr(4)), "not an llm.c model file"},
      {put("v7.bin", v7), "version 7"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { load_llmc(c.path); });
    EXPECT_NE(e.find(c.path), std::string::npos) << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
    std::printf("  %s\n", e.c_str());
  }
  EXPECT_NE(error_of([&] { load_weights((tmp() / "none.bin").string()); }).find("no such file"),
            std::string::npos);
}

// Hostile llm.c headers: a 263 KB file claiming L = 357,908,024 and C = 65,536 made
// num_parameters() overflow to 65,536, passed the size check and was loaded (then
// bad_alloc building the model). Every field is bounded (model/gpt2.h) before the size
// is computed and compared with the file.
TEST(Llmc, HostileHeadersAreRefusedBeforeAllocating) {
  auto file = [&](const std::string& name, std::array<int32_t, 6> f, size_t bytes) {
    std::string b(bytes, '\0');
    int32_t h[8] = {20240326, 3, f[0], f[1], f[2], f[3], f[4], f[5]};  // maxT V L NH C Vp
    std::memcpy(b.data(), h, sizeof h);
    const std::string q = (tmp() / name).string();
    std::ofstream(q, std::ios::binary) << b;
    return q;
  };
  const struct {
    std::string path, expect;
  } cases[] = {
      // (Vp + maxT) * C + the wrapped layer terms = 65,536 parameters: the probe's file.
      {file("overflow.bin", {725671, 50257, 357908024, 16, 65536, 50304}, 1024 + 65536 * 4),
       "n_layer = 357908024 is out of range, expected 1..96"},
      {file("embd.bin", {16, 256, 1, 1, 131072, 256}, 4096), "n_embd = 131072"},
      {file("seq.bin", {(1 << 20) + 1, 256, 1, 1, 8, 256}, 4096), "max_seq_len = 1048577"},
      {file("vocab.bin", {16, (1 << 24) + 1, 1, 1, 8, 0}, 4096), "vocab_size = 16777217"},
      {file("padded.bin", {16, 256, 1, 1, 8, 200}, 4096), "padded_vocab_size = 200"},
      {file("heads.bin", {16, 256, 1, 3, 8, 256}, 4096), "not divisible by n_head = 3"},
      {file("neg.bin", {16, 256, -2, 1, 8, 256}, 4096), "n_layer = -2"},
      // Within bounds but far larger than the file: refused by size, nothing allocated.
      {file("big.bin", {65536, 1 << 24, 96, 64, 8192, 1 << 24}, 4096),
       "size mismatch"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { load_llmc(c.path); });
    EXPECT_NE(e.find(c.path), std::string::npos) << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
  }
}

TEST(Safetensors, HuggingFaceNamesLayoutsAndRoundTrip) {
  const ModelWeights w = random_weights(4);
  const GPT2Config& c = w.config;
  const std::string p = (tmp() / "model.safetensors").string();
  save_safetensors(p, w);
  const std::string b = slurp(p);
  uint64_t hn;
  std::memcpy(&hn, b.data(), 8);
  EXPECT_EQ(hn % 8, 0u);
  const auto h = nlohmann::json::parse(b.substr(8, hn));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(h["__metadata__"]["n_head"], "3");
  EXPECT_EQ(h.size(), 1u + 2 + 12 * 2 + 2);
  EXPECT_EQ(h["transformer.wte.weight"]["shape"], nlohmann::json({301, 24}));  // unpadded
  EXPECT_EQ(h["transformer.wpe.weight"]["shape"], nlohmann::json({17, 24}));
  EXPECT_EQ(h["transformer.h.1.attn.c_attn.weight"]["shape"], nlohmann::json({24, 72}));
  EXPECT_EQ(h["transformer.h.1.mlp.c_fc.weight"]["shape"], nlohmann::json({24, 96}));
  EXPECT_EQ(h["transformer.h.1.mlp.c_proj.weight"]["shape"], nlohmann::json({96, 24}));
  EXPECT_FALSE(h.contains("lm_head.weight"));
  // Data lies back to back after the header, every byte used.
  uint64_t end = 0;
  for (auto it = h.begin(); it != h.end(); ++it)
    if (it.key() != "__metadata__") end = std::max<uint64_t>(end, it.value()["data_offsets"][1]);
  EXPECT_EQ(8 + hn + end, b.size());
  // Conv1D layout: file c_attn[i][o] == our qkvw[layer 1][o][i].
  auto at = [&](const std::string& name, int64_t i) {
    float f;
    std::memcpy(&f, b.data() + 8 + hn + h[name]["data_offsets"][0].get<uint64_t>() + 4 * i, 4);
    return f;
  };
  const int64_t C = c.n_embd;
  const float* qkv1 = w.params.data() + offset_of(c, kQkvw) + 3 * C * C;
  for (int64_t i : {0, 5, 23})
    for (int64_t o : {0, 13, 71}) EXPECT_EQ(at("transformer.h.1.attn.c_attn.weight", i * 3 * C + o), qkv1[o * C + i]);
  const float* fcp0 = w.params.data() + offset_of(c, kFcprojw);
  EXPECT_EQ(at("transformer.h.0.mlp.c_proj.weight", 95 * C + 7), fcp0[7 * 4 * C + 95]);
  // Round trip: everything but the padded vocabulary rows (not stored; read back as zero).
  const ModelWeights r = load_weights(p);
  ASSERT_EQ(r.params.size(), w.params.size());
  const int64_t pad0 = static_cast<int64_t>(c.vocab_size) * C, pad1 = static_cast<int64_t>(c.vp()) * C;
  for (int64_t i = 0; i < static_cast<int64_t>(w.params.size()); ++i)
    ASSERT_EQ(r.params[i], (i >= pad0 && i < pad1) ? 0.0f : w.params[i]) << i;
  // The Hub's unprefixed names, an lm_head copy and old attention buffers are accepted.
  std::string js = b.substr(8, hn);
  size_t pos;
  while ((pos = js.find("\"transformer.")) != std::string::npos) js.erase(pos + 1, 12);
  js.append((8 - js.size() % 8) % 8, ' ');
  std::string hub(8, '\0');
  const uint64_t n2 = js.size();
  std::memcpy(hub.data(), &n2, 8);
  hub += js + b.substr(8 + hn);
  const std::string ph = (tmp() / "hub.safetensors").string();
  std::ofstream(ph, std::ios::binary) << hub;
  EXPECT_EQ(load_weights(ph).params, r.params);
  // BF16 export rounds each value once.
  save_safetensors(p, w, "BF16");
  const ModelWeights rb = load_weights(p);
  for (int64_t i = 0; i < pad0; ++i) ASSERT_EQ(rb.params[i], round_bf16(w.params[i]));
}

TEST(Safetensors, BadFilesAreRefused) {
  const ModelWeights w = random_weights(5);
  const std::string p = (tmp() / "ok.safetensors").string();
  save_safetensors(p, w);
  const std::string b = slurp(p);
  uint64_t hn;
  std::memcpy(&hn, b.data(), 8);
  auto put = [&](const std::string& name, const std::string& bytes) {
    const std::string q = (tmp() / name).string();
    std::ofstream(q, std::ios::binary) << bytes;
    return q;
  };
  std::string renamed = b;
  const size_t at = renamed.find("ln_f.bias");
  renamed.replace(at, 9, "ln_x.bias");
  const struct {
    std::string path, expect;
  } cases[] = {
      {put("trunc.safetensors", b.substr(0, b.size() - 8)), "truncated"},
      {put("hdr.safetensors", b.substr(0, 100)), "truncated"},
      {put("renamed.safetensors", renamed), "ln_f.bias"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { load_weights(c.path); });
    EXPECT_NE(e.find(c.path), std::string::npos) << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
    std::printf("  %s\n", e.c_str());
  }
}

// Hostile safetensors layouts: each was loaded before (shifted or overlapping data read
// as weights, "2.5" read as 2 heads) or gave "error: stoi".
TEST(Safetensors, HostileLayoutsAndMetadataAreRefused) {
  const ModelWeights w = random_weights(6);
  const std::string p = (tmp() / "base.safetensors").string();
  save_safetensors(p, w);
  const std::string b = slurp(p);
  uint64_t hn;
  std::memcpy(&hn, b.data(), 8);
  const nlohmann::ordered_json h0 = nlohmann::ordered_json::parse(b.substr(8, hn));
  const std::string data0 = b.substr(8 + hn);
  // A file from a header (padded with `pad` spaces), a header length `delta` off the truth.
  auto file = [&](const std::string& name, const nlohmann::ordered_json& h, const std::string& data,
                  size_t pad = 0, int64_t delta = 0) {
    const std::string js = h.dump() + std::string(pad, ' ');
    std::string out(8, '\0');
    const uint64_t n = uint64_t(int64_t(js.size()) + delta);
    std::memcpy(out.data(), &n, 8);
    out += js + data;
    const std::string q = (tmp() / name).string();
    std::ofstream(q, std::ios::binary) << out;
    return q;
  };
  const std::string wte = "transformer.wte.weight", lnfb = "transformer.ln_f.bias",
                    lnfw = "transformer.ln_f.weight";
  auto edit = [&](auto f) {
    nlohmann::ordered_json h = h0;
    f(h);
    return h;
  };
  const struct {
    std::string path, expect;
  } cases[] = {
      // Header length one short: the header's last padding byte becomes data, every tensor
      // shifted by one byte.
      {file("short_hdr.st", h0, data0, 8, -1), "belong to no tensor"},
      {file("trailing.st", h0, data0 + "xxxx"), "bytes [" + std::to_string(data0.size())},
      {file("overlap.st", edit([&](auto& h) { h[lnfb]["data_offsets"] = h[lnfw]["data_offsets"]; }),
            data0),
       "overlap tensor"},
      {file("reversed.st", edit([&](auto& h) { h[lnfb]["data_offsets"] = {8, 4}; }), data0),
       "data_offsets [8, 4), expected begin <= end"},
      {file("size.st", edit([&](auto& h) { h[lnfb]["shape"] = {3}; }), data0),
       "but shape [3] of F32 needs 12"},
      {file("huge.st", edit([&](auto& h) { h[lnfb]["shape"] = {uint64_t(1) << 40, uint64_t(1) << 40}; }),
            data0),
       "needs more than the file holds"},
      {file("negdim.st", edit([&](auto& h) { h[lnfb]["shape"] = {-8}; }), data0),
       "expected non-negative integers"},
      {file("dtype.st", edit([&](auto& h) { h[lnfb]["dtype"] = "F99"; }), data0),
       "unknown dtype 'F99'"},
      {file("notens.st", edit([&](auto& h) { h[lnfb] = 5; }), data0), "is not an object"},
      {file("i32.st", edit([&](auto& h) { h[lnfb]["dtype"] = "I32"; }), data0),
       "dtype I32 (F32, BF16, F16 or F64 expected)"},
      {file("meta_obj.st", edit([&](auto& h) { h["__metadata__"] = 3; }), data0),
       "__metadata__ is not a JSON object"},
      {file("meta_num.st", edit([&](auto& h) { h["__metadata__"]["n_head"] = 2; }), data0),
       "__metadata__ 'n_head' is not a string"},
      {file("half.st", edit([&](auto& h) { h["__metadata__"]["n_head"] = "2.5"; }), data0),
       "__metadata__ n_head = '2.5', expected an integer in 1..64"},
      {file("2x.st", edit([&](auto& h) { h["__metadata__"]["n_head"] = "2x"; }), data0),
       "n_head = '2x'"},
      {file("empty.st", edit([&](auto& h) { h["__metadata__"]["n_head"] = ""; }), data0),
       "n_head = ''"},
      {file("big.st", edit([&](auto& h) { h["__metadata__"]["n_head"] = "99999999999"; }), data0),
       "n_head = '99999999999'"},
      {file("layers.st", edit([&](auto& h) { h["__metadata__"]["n_layer"] = "5"; }), data0),
       "__metadata__ n_layer = 5 but the tensors give"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { load_weights(c.path); });
    EXPECT_NE(e.find(c.path), std::string::npos) << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.path << ": " << e;
    EXPECT_EQ(e.find("stoi"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // The unedited header, with padding, loads.
  EXPECT_EQ(load_weights(file("padded.st", h0, data0, 8)).params, load_weights(p).params);
}

// A small file whose wte says the widest n_embd (8192; the probe's 65536 is now refused by
// the shape bounds) and whose other tensors are tiny: the parameters (~0.8e9 values for one
// layer) were allocated from that shape before the other tensors' shapes were checked
// (std::bad_alloc at 65536). Now every tensor is checked first.
TEST(Safetensors, ShapesAreCheckedBeforeTheParametersAreAllocated) {
  const int64_t C = 8192;  // kMaxEmbd
  nlohmann::ordered_json h;
  uint64_t at = 0;
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    h[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {at, at + uint64_t(n) * 4}}};
    at += uint64_t(n) * 4;
  };
  tensor("transformer.wte.weight", {1, C});
  tensor("transformer.wpe.weight", {1, C});
  for (const char* t : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                        "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                        "mlp.c_proj.bias"})
    tensor(std::string("transformer.h.0.") + t, {1});
  tensor("transformer.ln_f.weight", {1});
  tensor("transformer.ln_f.bias", {1});
  h["__metadata__"] = {{"n_head", "1"}};
  std::string js = h.dump();
  js.append((8 - js.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = js.size();
  std::memcpy(out.data(), &n, 8);
  out += js + std::string(at, '\0');
  const std::string q = (tmp() / "wide.safetensors").string();
  std::ofstream(q, std::ios::binary) << out;
  const std::string e = error_of([&] { load_weights(q); });
  EXPECT_NE(e.find(q), std::string::npos) << e;
  EXPECT_NE(e.find("tensor 'transformer.h.0.ln_1.weight' has shape [1], expected [8192]"),
            std::string::npos)
      << e;
}

// ---- through `train` ----

namespace {

std::string yaml(const std::string& out_dir, const std::string& extra_model,
                 const std::string& data, int max_steps) {
  std::ostringstream y;
  y << "run: {name: t, out_dir: '" << out_dir << "', seed: 3, threads: 1}\n"
    << "model: {n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 16" << extra_model << "}\n"
    << data << "\n"
    << "train: {max_steps: " << max_steps << ", batch_size: 4, seq_len: 16, lr: 3.0e-3,"
    << " min_lr: 3.0e-4, warmup_steps: 2, ckpt_every: 5, keep_checkpoints: 0, eval_every: 5,"
    << " eval_batches: 2, log_every: 5, sample_tokens: 20}\n"
    << "device: cpu\n";
  return y.str();
}

const std::string kGpt2Data = std::string("data: {train_path: '") + (tmp() / "sh/ts_train_*.bin").string() +
                              "', val_path: '" + (tmp() / "sh/ts_val_*.bin").string() +
                              "', tokenizer: gpt2, tokenizer_dir: '" ST_SHARED_DATA_DIR
                              "/gpt2-tokenizer', prepare_from: '" ST_SHARED_DATA_DIR
                              "/tinyshakespeare.txt'}";

Config cfg(const std::string& name, const std::string& extra_model, int steps,
           const std::vector<std::string>& sets = {}) {
  return parse_config(yaml((tmp() / name).string(), ", vocab_size: 50257" + extra_model, kGpt2Data, steps),
                      name + ".yaml", sets);
}

TrainOptions quiet() {
  TrainOptions o;
  o.console = false;
  return o;
}

using st::test::Cmd;
Cmd run(const std::string& cmd) { return st::test::run_cmd(cmd, tmp()); }

}  // namespace

// GPT-2 BPE shards (prepared on first use): the loss falls, two runs agree bit for bit, and
// 6 steps + resume + 6 equal 12 straight.
TEST(TrainGpt2, ShardsTrainDeterministicallyAndResumeExactly) {
  const TrainResult a = run_training(cfg("bpe_a", "", 12), quiet());
  const TrainResult b = run_training(cfg("bpe_b", "", 12), quiet());
  ASSERT_EQ(a.losses.size(), 12u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.weights_sha256, b.weights_sha256);
  EXPECT_LT(a.losses.back(), a.losses.front() - 0.5) << "the loss did not fall";
  EXPECT_FALSE(a.sample.empty());
  TrainOptions first = quiet();
  first.stop_after = 6;
  run_training(cfg("bpe_c", "", 12), first);
  TrainOptions again = quiet();
  again.resume = true;
  const TrainResult c = run_training(cfg("bpe_c", "", 12), again);
  EXPECT_EQ(c.first_step, 6);
  EXPECT_EQ(std::vector<float>(a.losses.begin() + 6, a.losses.end()), c.losses);
  EXPECT_EQ(c.weights_sha256, a.weights_sha256);
  std::printf("  loss %.3f -> %.3f, val %.4f; sample: %.60s...\n", a.losses.front(),
              a.losses.back(), a.val_loss, a.sample.c_str());
}

// An llm.c model with more tokens than train's uint16 token files hold converts (other
// tools can read it) but says that train cannot use the result (the probe: silent).
TEST(ExportWeights, VocabularyBeyondTrainsTokenIdsConvertsWithAWarning) {
  ModelWeights w;
  w.config.n_layer = 1, w.config.n_head = 1, w.config.n_embd = 4, w.config.max_seq_len = 4;
  w.config.vocab_size = 70000;
  w.config.padded_vocab_size = w.config.vp();
  w.params.assign(size_t(num_parameters(w.config)), 0.25f);
  const std::string src = (tmp() / "v70000.llmc.bin").string(), out = (tmp() / "v70000_hf").string();
  save_llmc(src, w, false);
  const Cmd r = run(std::string(ST_EXPORT_BIN) + " --input " + src + " --format safetensors --output " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("export_weights: warning: " + src + " has vocab_size 70000, above the 65536 "
                       "token ids train stores (uint16)"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  const ModelWeights back = load_weights(out + "/model.safetensors");
  EXPECT_EQ(back.config.vocab_size, 70000);
  EXPECT_EQ(back.params.size(), w.params.size());
  std::printf("  %s", r.err.c_str());
}

// A run started from exported weights evaluates like the run that wrote them: llm.c FP32,
// safetensors FP32 and the checkpoint itself all give the same first-step validation loss.
TEST(TrainGpt2, InitFromLlmcSafetensorsAndCheckpoint) {
  const TrainResult src = run_training(cfg("src", "", 5), quiet());
  const std::string ck = latest_checkpoint((tmp() / "src").string());
  ASSERT_FALSE(ck.empty());
  const std::string llmc = (tmp() / "src.llmc.bin").string(), st_dir = (tmp() / "src_hf").string();
  Cmd r = run(std::string(ST_EXPORT_BIN) + " --input " + (tmp() / "src").string() +
              " --format llmc --output " + llmc);
  ASSERT_EQ(r.code, 0) << r.err;
  r = run(std::string(ST_EXPORT_BIN) + " --input " + ck + " --format safetensors --output " + st_dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(st_dir + "/config.json"));
  std::printf("  %s", r.out.c_str());
  // Same weights in every format.
  const auto w_ck = load_weights(ck).params;
  EXPECT_EQ(load_weights(llmc).params, w_ck);
  // A step with a vanishing learning rate leaves the weights as loaded; evaluation then
  // uses the same validation batches as the source run's last evaluation.
  const std::vector<std::string> frozen = {"train.lr=1e-30", "train.min_lr=0", "train.warmup_steps=0"};
  for (const std::string& from : {llmc, st_dir + "/model.safetensors", ck}) {
    const std::string name = "init_" + std::to_string(std::hash<std::string>{}(from) % 10000);
    std::vector<std::string> sets = frozen;
    sets.push_back("model.init_from=" + from);
    const TrainResult t = run_training(cfg(name, "", 1, sets), quiet());
    EXPECT_NEAR(t.val_loss, src.val_loss, 1e-6 * src.val_loss) << from;
    std::printf("  init_from %s: val_loss %.7f (source run %.7f)\n", fs::path(from).filename().c_str(),
                t.val_loss, src.val_loss);
  }
  // The config must describe the same model as the file.
  const std::string e = error_of([&] {
    run_training(cfg("mismatch", "", 1, {"model.init_from=" + llmc, "model.n_layer=3"}), quiet());
  });
  EXPECT_NE(e.find("n_layer 2 (config 3)"), std::string::npos) << e;
  std::printf("  %s\n", e.c_str());
  const std::string e2 = error_of([&] {
    run_training(cfg("missing", "", 1, {"model.init_from=/nonexistent/model.bin"}), quiet());
  });
  EXPECT_NE(e2.find("model.init_from"), std::string::npos) << e2;
  EXPECT_NE(e2.find("/nonexistent/model.bin"), std::string::npos) << e2;
}

// A model vocabulary larger than GPT-2's (llm.c's padded 50304 as vocab_size) still samples
// only ids the tokenizer can decode.
TEST(TrainGpt2, SampleWithLargerModelVocabulary) {
  Config c = parse_config(yaml((tmp() / "v50304").string(), ", vocab_size: 50304", kGpt2Data, 2),
                          "v50304.yaml", {"train.sample_tokens=200"});
  const TrainResult r = run_training(c, quiet());
  EXPECT_FALSE(r.sample.empty());
}

TEST(TrainGpt2, MissingVocabularyIsAClearError) {
  const std::string y = (tmp() / "novocab.yaml").string();
  std::ofstream(y) << yaml((tmp() / "novocab").string(), ", vocab_size: 50257",
                           "data: {train_path: '" ST_SHARED_DATA_DIR "/tinyshakespeare.txt', tokenizer: gpt2}", 2);
  const Cmd r = run(std::string(ST_TRAIN_BIN) + " --config " + y +
                    " --set data.tokenizer_dir=/nonexistent/tok");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("/nonexistent/tok/encoder.json"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  std::printf("  %s", r.err.c_str());
}

