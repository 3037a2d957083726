// Config parsing, validation, overrides, YAML round trip and help text. Expected values and
// the list of keys are written out here by hand, independently of the schema table in
// config.cpp, so a key missing from the schema or a wrong default shows up as a failure.
#include <gtest/gtest.h>

#include "test_util.h"
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <memory>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/config.h"

using namespace st;

namespace {

const char* kFile = "configs/x.yaml";

// Every key, in the form --set uses. Keep in step with Config.
const std::vector<std::string> kAllKeys = {"device",
                                           "run.name",
                                           "run.out_dir",
                                           "run.seed",
                                           "run.threads",
                                           "model.n_layer",
                                           "model.n_head",
                                           "model.n_embd",
                                           "model.max_seq_len",
                                           "model.vocab_size",
                                           "model.init_from",
                                           "data.train_path",
                                           "data.val_path",
                                           "data.tokenizer",
                                           "data.val_fraction",
                                           "train.max_steps",
                                           "train.batch_size",
                                           "train.seq_len",
                                           "train.grad_accum_steps",
                                           "train.lr",
                                           "train.min_lr",
                                           "train.warmup_steps",
                                           "train.beta1",
                                           "train.beta2",
                                           "train.eps",
                                           "train.weight_decay",
                                           "train.grad_clip",
                                           "train.ckpt_every",
                                           "train.keep_checkpoints",
                                           "train.eval_every",
                                           "train.eval_batches",
                                           "train.log_every",
                                           "train.sample_tokens",
                                           "precision.compute",
                                           "precision.loss_scale_init",
                                           "precision.loss_scale_growth_interval",
                                           "attention.backend",
                                           "hooks.every"};

// Names of the fields where a and b differ (source excluded: it is not part of the YAML).
std::vector<std::string> diff(const Config& a, const Config& b) {
  std::vector<std::string> d;
#define CMP(f) \
  if (!(a.f == b.f)) d.push_back(#f)
  CMP(device);
  CMP(run.name);
  CMP(run.out_dir);
  CMP(run.seed);
  CMP(run.threads);
  CMP(model.n_layer);
  CMP(model.n_head);
  CMP(model.n_embd);
  CMP(model.max_seq_len);
  CMP(model.vocab_size);
  CMP(model.init_from);
  CMP(data.train_path);
  CMP(data.val_path);
  CMP(data.tokenizer);
  CMP(data.val_fraction);
  CMP(train.max_steps);
  CMP(train.batch_size);
  CMP(train.seq_len);
  CMP(train.grad_accum_steps);
  CMP(train.lr);
  CMP(train.min_lr);
  CMP(train.warmup_steps);
  CMP(train.beta1);
  CMP(train.beta2);
  CMP(train.eps);
  CMP(train.weight_decay);
  CMP(train.grad_clip);
  CMP(train.ckpt_every);
  CMP(train.keep_checkpoints);
  CMP(train.eval_every);
  CMP(train.eval_batches);
  CMP(train.log_every);
  CMP(train.sample_tokens);
  CMP(precision.compute);
  CMP(precision.loss_scale_init);
  CMP(precision.loss_scale_growth_interval);
  CMP(attention.backend);
  CMP(hooks.every);
#undef CMP
  return d;
}

// The st::Error message `f` throws; fails the test when it throws nothing.
using st::test::error_of;

// Error from parsing `yaml` (or applying `overrides`); checks the one-line, file-first form.
std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  const std::string msg = error_of([&] { parse_config(yaml, kFile, overrides); });
  EXPECT_EQ(msg.rfind(kFile, 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  return msg;
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

// A config with every field away from its default (valid, and tricky for YAML).
Config everything_changed() {
  Config c;
  c.device = "cpu";
  c.run = {"yes", "runs/a: b # not a comment", std::numeric_limits<uint64_t>::max(), 7};
  c.model = {6, 6, 384, 1024, 50304, "null"};
  c.data = {" leading space.txt", "123", "text", "gpt2", "dir: with # colon", "on", 0.1 + 0.2};
  TrainSection& t = c.train;
  t.max_steps = 5000, t.batch_size = 16, t.seq_len = 1024, t.grad_accum_steps = 4;
  t.lr = 6e-4, t.min_lr = 1.0 / 3 * 1e-4, t.warmup_steps = 0, t.beta1 = 0.0, t.beta2 = 0.999;
  t.eps = 5e-324, t.weight_decay = 0.0, t.grad_clip = 0.0, t.ckpt_every = 0;
  t.keep_checkpoints = 0, t.eval_every = 0, t.eval_batches = 1, t.log_every = 10;
  t.sample_tokens = 0;
  c.precision = {"bf16", 16777216.0, 1};
  c.attention.backend = "stabilized_flash";
  c.attention.o_tilde_bits = 5;
  c.hooks.every = 25;
  return c;
}

}  // namespace

TEST(Config, DefaultsFromEmptyFile) {
  for (const char* text : {"", "# only a comment\n", "hooks:\n"}) {
    const Config c = parse_config(text, kFile);
    EXPECT_TRUE(diff(c, Config{}).empty()) << text;
    EXPECT_EQ(c.source, kFile);
  }
  EXPECT_NO_THROW(validate_config(Config{}));
  const Config c;  // spot-check the documented defaults
  EXPECT_EQ(c.device, "auto");
  EXPECT_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.precision.compute, "fp32");
}

TEST(Config, FullValidFile) {
  const std::string yaml = R"(
device: cuda
run: {name: shakespeare, out_dir: runs/s1, seed: 18446744073709551615, threads: 8}
model:
  n_layer: 12
  n_head: 12
  n_embd: 768
  max_seq_len: 1024
  vocab_size: 50257
  init_from: "runs/base/ckpt_1000.bin"
data:
  train_path: data/train.txt
  val_path: data/val.txt
  tokenizer: gpt2
  val_fraction: 0.05
train:
  max_steps: 99999999
  batch_size: 4
  seq_len: 1024
  grad_accum_steps: 8
  lr: 6e-4
  min_lr: +6.0e-5
  warmup_steps: 700
  beta1: 0.9
  beta2: 0.95
  eps: 1e-8
  weight_decay: 0
  grad_clip: 1
  ckpt_every: 500
  keep_checkpoints: 3
  eval_every: 250
  eval_batches: 20
  log_every: 10
  sample_tokens: 0
precision:
  compute: bf16
  loss_scale_init: 1024
  loss_scale_growth_interval: 100
attention:
  backend: flash
hooks:
  every: 50
)";
  const Config c = parse_config(yaml, kFile);
  EXPECT_EQ(c.device, "cuda");
  EXPECT_EQ(c.run.name, "shakespeare");
  EXPECT_EQ(c.run.seed, 18446744073709551615ull);
  EXPECT_EQ(c.run.threads, 8);
  EXPECT_EQ(c.model.n_embd, 768);
  EXPECT_EQ(c.model.init_from, "runs/base/ckpt_1000.bin");
  EXPECT_EQ(c.data.tokenizer, "gpt2");
  EXPECT_EQ(c.data.val_fraction, 0.05);
  EXPECT_EQ(c.train.max_steps, 99999999);
  EXPECT_EQ(c.train.lr, 6e-4);
  EXPECT_EQ(c.train.min_lr, 6e-5);
  EXPECT_EQ(c.train.eps, 1e-8);
  EXPECT_EQ(c.train.weight_decay, 0.0);
  EXPECT_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.precision.compute, "bf16");
  EXPECT_EQ(c.precision.loss_scale_init, 1024.0);
  EXPECT_EQ(c.attention.backend, "flash");
  EXPECT_EQ(c.hooks.every, 50);
}

TEST(Config, UnknownKeyOrSection) {
  std::string m = parse_error("train:\n  lr: 0.01\n  max_step: 5\n");
  EXPECT_HAS(m, "configs/x.yaml:3: unknown key 'train.max_step'");
  EXPECT_HAS(m, "(did you mean 'train.max_steps'?)");
  m = parse_error("train:\n  n_layer: 2\n");  // right key, wrong section
  EXPECT_HAS(m, "unknown key 'train.n_layer' (did you mean 'model.n_layer'?)");
  m = parse_error("trian:\n  lr: 0.1\n");
  EXPECT_HAS(m, "unknown section 'trian' (did you mean 'train'?)");
  m = parse_error("lr: 0.1\n");
  EXPECT_HAS(m, "unknown key 'lr' (did you mean 'train.lr'?)");
  m = parse_error("train:\n  frobnicate: 1\n");  // nothing close: no suggestion
  EXPECT_HAS(m, "unknown key 'train.frobnicate'");
  EXPECT_EQ(m.find("did you mean"), std::string::npos) << m;
  m = parse_error("train.lr: 0.1\n");
  EXPECT_HAS(m, "'train.lr' must be written as 'lr:' under 'train:'");
  m = parse_error("train:\n  lr: 0.1\n  lr: 0.2\n");
  EXPECT_HAS(m, "duplicate key 'train.lr'");
}

TEST(Config, WrongTypes) {
  EXPECT_HAS(parse_error("train:\n  batch_size: eight\n"),
             "train.batch_size: expected an integer, got 'eight'");
  EXPECT_HAS(parse_error("train:\n  batch_size: 3.5\n"), "expected an integer, got '3.5'");
  EXPECT_HAS(parse_error("train:\n  batch_size: 1e3\n"), "expected an integer");
  EXPECT_HAS(parse_error("train:\n  batch_size:\n"), "expected an integer, got an empty value");
  EXPECT_HAS(parse_error("run:\n  seed: -1\n"), "run.seed: expected an integer");
  EXPECT_HAS(parse_error("run:\n  seed: 18446744073709551616\n"), "run.seed: expected an integer");
  EXPECT_HAS(parse_error("train:\n  lr: abc\n"), "train.lr: expected a number, got 'abc'");
  EXPECT_HAS(parse_error("train:\n  lr: nan\n"), "train.lr: expected a finite number");
  EXPECT_HAS(parse_error("train:\n  lr: inf\n"), "train.lr: expected a finite number");
  EXPECT_HAS(parse_error("train:\n  lr: .inf\n"), "train.lr: expected a number");
  EXPECT_HAS(parse_error("train:\n  lr: 1e999\n"), "train.lr = 1e999 is out of range");
  EXPECT_HAS(parse_error("train:\n  lr: [1, 2]\n"), "train.lr: expected a number, got a sequence");
  EXPECT_HAS(parse_error("run:\n  name: {a: 1}\n"), "run.name: expected a string");
  const std::string fp8 = parse_error("precision:\n  compute: fp8\n");
  EXPECT_HAS(fp8, "precision.compute: expected one of fp32|bf16|fp16|fp64, got 'fp8'");
  EXPECT_EQ(fp8.find("did you mean"), std::string::npos) << fp8;  // no far-fetched guess
  EXPECT_HAS(parse_error("attention:\n  backend: stabilised_flash\n"),
             "(did you mean 'stabilized_flash'?)");
  EXPECT_HAS(parse_error("device: gpu\n"), "device: expected one of auto|cpu|cuda, got 'gpu'");
  EXPECT_HAS(parse_error("data:\n  tokenizer: [byte]\n"),
             "data.tokenizer: expected one of byte|gpt2, got a sequence");
  EXPECT_HAS(parse_error("train: 5\n"), "train: expected a mapping of keys, got '5'");
  EXPECT_HAS(parse_error("- train\n- model\n"), "expected a mapping of sections");
  EXPECT_HAS(parse_error("train:\n  lr: [0.1\n"), "invalid YAML");
  // Strings take any scalar as text.
  EXPECT_EQ(parse_config("run:\n  name: 123\n", kFile).run.name, "123");
  EXPECT_EQ(parse_config("model:\n  init_from:\n", kFile).model.init_from, "");
}

TEST(Config, OutOfRange) {
  EXPECT_HAS(parse_error("train:\n  lr: -1\n"), "train.lr = -1 is out of range (must be > 0");
  EXPECT_HAS(parse_error("train:\n  lr: 0\n"), "train.lr = 0 is out of range");
  EXPECT_HAS(parse_error("model:\n  n_layer: 97\n"),
             "model.n_layer = 97 is out of range (must be between 1 and 96)");
  EXPECT_HAS(parse_error("model:\n  n_layer: 0\n"), "model.n_layer = 0 is out of range");
  EXPECT_HAS(parse_error("train:\n  beta2: 1.0\n"), "train.beta2 = 1.0 is out of range");
  EXPECT_HAS(parse_error("train:\n  eps: 0\n"), "train.eps = 0 is out of range");
  EXPECT_HAS(parse_error("data:\n  val_fraction: 0.6\n"), "data.val_fraction = 0.6");
  EXPECT_HAS(parse_error("train:\n  grad_clip: -0.5\n"), "train.grad_clip = -0.5");
  EXPECT_HAS(parse_error("train:\n  eval_batches: 0\n"), "train.eval_batches = 0");
  EXPECT_HAS(parse_error("run:\n  threads: 1025\n"), "run.threads = 1025");
  EXPECT_HAS(parse_error("run:\n  threads: -1\n"), "run.threads = -1 is out of range");
  EXPECT_HAS(parse_error("run:\n  threads: many\n"),
             "run.threads: expected an integer or auto, got 'many'");
  EXPECT_HAS(parse_error("precision:\n  loss_scale_init: 16777217\n"),
             "precision.loss_scale_init = 16777217");
  // Below the fp16 scaler's floor of 1 (a scale of 1e-45 turned every gradient into NaN),
  // and past the 8 digits of a checkpoint's name.
  EXPECT_HAS(parse_error("precision:\n  loss_scale_init: 1e-45\n"),
             "precision.loss_scale_init = 1e-45 is out of range");
  EXPECT_HAS(parse_error("train:\n  max_steps: 100000000\n"),
             "train.max_steps = 100000000 is out of range");
  // Past int, and past 64 bits: a range error, not a silent wrap.
  EXPECT_HAS(parse_error("train:\n  warmup_steps: 3000000000\n"),
             "train.warmup_steps = 3000000000 is out of range");
  EXPECT_HAS(parse_error("train:\n  max_steps: 99999999999999999999999\n"),
             "train.max_steps = 99999999999999999999999 is out of range");
  // Edges that are allowed.
  const Config c = parse_config(
      "train: {lr: 10, min_lr: 0, beta1: 0, grad_clip: 0, warmup_steps: 0}\n"
      "precision: {loss_scale_init: 16777216}\nmodel: {n_layer: 96}\n",
      kFile);
  EXPECT_EQ(c.train.lr, 10.0);
  EXPECT_EQ(c.model.n_layer, 96);
}

TEST(Config, CrossFieldChecks) {
  EXPECT_HAS(parse_error("model: {n_embd: 100, n_head: 3}\n"),
             "model.n_embd = 100 is not divisible by model.n_head = 3");
  EXPECT_HAS(parse_error("train: {seq_len: 512}\n"),
             "train.seq_len = 512 exceeds model.max_seq_len = 256");
  EXPECT_HAS(parse_error("train: {lr: 0.001, min_lr: 0.01}\n"),
             "train.min_lr = 0.01 exceeds train.lr = 0.001");
  EXPECT_HAS(parse_error("data: {tokenizer: gpt2}\n"), "model.vocab_size = 256");
  // attention.o_tilde_bits narrows flash's O~: not on baseline (the default backend), not
  // for an O~ outside FP32's exponent range, and only below the format's own bits.
  EXPECT_HAS(parse_error("attention: {o_tilde_bits: 3}\n"),
             "layer 0: attention.o_tilde_bits = 3 is set, but the baseline backend has no O~");
  EXPECT_HAS(parse_error("attention: {backend: flash, o_tilde_bits: 3, "
                         "layer_backends: '1:baseline'}\n"),
             "layer 1: attention.o_tilde_bits = 3 is set, but the baseline backend");
  EXPECT_HAS(parse_error("attention: {backend: flash, accum: fp16, o_tilde_bits: 3}\n"),
             "O~ is fp16 here (set attention.accum: bf16 or fp32)");
  EXPECT_HAS(parse_error("precision: {compute: bf16}\n"
                         "attention: {backend: flash, accum: bf16, o_tilde_bits: 7}\n"),
             "attention.o_tilde_bits = 7 must be in 1..6");
  EXPECT_HAS(parse_error("attention: {backend: flash, o_tilde_bits: 22}\n"),
             "attention.o_tilde_bits = 22 is out of range");
  EXPECT_EQ(parse_config("precision: {compute: bf16}\n"
                         "attention: {backend: flash, accum: bf16, o_tilde_bits: 3}\n", kFile)
                .attention.o_tilde_bits, 3);
  // attention.o_tilde_scope needs o_tilde_bits; attention.tie_break is flash's alone.
  EXPECT_HAS(parse_error("attention: {backend: flash, o_tilde_scope: tied}\n"),
             "attention.o_tilde_scope = tied says where O~'s rounding is amplified, but "
             "attention.o_tilde_bits and o_tilde_gain are 0");
  EXPECT_HAS(parse_error("attention: {backend: flash, o_tilde_bits: 2, o_tilde_scope: ties}\n"),
             "attention.o_tilde_scope");
  EXPECT_HAS(parse_error("attention: {backend: stabilized_flash, tie_break: 0.004}\n"),
             "attention.tie_break = 0.004 is set, but the backend is stabilized_flash");
  EXPECT_HAS(parse_error("attention: {tie_break: 0.004}\n"),
             "layer 0: attention.tie_break = 0.004 is set, but the backend is baseline");
  EXPECT_HAS(parse_error("attention: {backend: flash, tie_break: -1}\n"), "attention.tie_break");
  EXPECT_HAS(parse_error("attention: {backend: flash, o_tilde_gain: 8, o_tilde_bits: 2}\n"),
             "are two amplifiers of O~'s rounding; set one of them");
  EXPECT_HAS(parse_error("attention: {o_tilde_gain: 8}\n"),
             "attention.o_tilde_gain = 8 is set, but the baseline backend has no O~");
  // attention.cuda_kernel: the CUDA flash forward kernel (the CPU has one implementation).
  EXPECT_HAS(parse_error("attention: {backend: flash, cuda_kernel: wgmma}\n"),
             "attention.cuda_kernel");
  EXPECT_EQ(attention_configs(parse_config("attention: {backend: flash, cuda_kernel: sm90, "
                                           "block_q: 128, block_k: 128}\n", kFile))[0]
                .cuda_kernel,
            FlashKernel::Sm90);
  EXPECT_EQ(attention_configs(parse_config("attention: {backend: flash}\n", kFile))[0].cuda_kernel,
            FlashKernel::MmaSync);
  {
    const Config sc = parse_config("precision: {compute: bf16}\n"
                                   "attention: {backend: flash, accum: bf16, o_tilde_bits: 1, "
                                   "o_tilde_scope: untied_matched, tie_break: 0.00390625}\n", kFile);
    const AttnNumerics n = attention_configs(sc)[0].numerics(DType::BF16, 0);
    EXPECT_EQ(n.o_tilde_scope, OTildeScope::UntiedMatched);
    EXPECT_EQ(n.tie_break, 0.00390625);
  }
  Config c;
  c.source = "built_in_code";
  c.model.n_head = 5;
  const std::string m = error_of([&] { validate_config(c); });
  EXPECT_HAS(m, "built_in_code: model.n_embd = 128 is not divisible");
  c = Config{};
  c.train.lr = -1;
  EXPECT_HAS(error_of([&] { validate_config(c); }), "train.lr = -1 is out of range");
}

// attention.backend cudnn is NVIDIA's GPU kernel: a config that can never put it on a GPU,
// or gives it a format cuDNN's fused attention does not take, is refused at load time, by
// key; device auto is accepted here (the CPU backend refuses it at run time, tested in
// test_attention_class.cpp).
TEST(Config, CudnnBackendIsGpuOnly) {
  EXPECT_HAS(parse_error("device: cpu\nprecision: {compute: bf16}\nattention: {backend: cudnn}\n"),
             "attention.backend = cudnn but device is cpu: cuDNN's fused attention runs only on "
             "an NVIDIA GPU");
  EXPECT_HAS(parse_error("device: cpu\nprecision: {compute: bf16}\n"
                         "attention: {backend: flash, layer_backends: '1:cudnn'}\n"),
             "attention.layer_backends puts cudnn on layer 1, but device is cpu");
  EXPECT_HAS(parse_error("device: cuda\nattention: {backend: cudnn}\n"),
             "attention.backend = cudnn but precision.compute is fp32: cuDNN's fused attention "
             "takes bf16 or fp16 (set precision.compute: bf16)");
  EXPECT_HAS(parse_error("device: cuda\nprecision: {compute: fp64}\nattention: {backend: cudnn}\n"),
             "precision.compute is fp64");
  EXPECT_HAS(parse_error("attention: {backend: cudnnn}\n"),
             "expected one of baseline|flash|stabilized_flash|cudnn, got 'cudnnn'");
  const Config c = parse_config(
      "device: cuda\nprecision: {compute: bf16}\nattention: {layer_backends: '0:cudnn'}\n", kFile);
  const std::vector<AttentionConfig> layers = attention_configs(c);
  EXPECT_EQ(layers[0].kind, AttentionKind::Cudnn);
  EXPECT_EQ(layers[1].kind, AttentionKind::Baseline);
  EXPECT_EQ(parse_config("device: auto\nprecision: {compute: fp16}\nattention: {backend: cudnn}\n",
                         kFile).attention.backend, "cudnn");
}

TEST(Config, Overrides) {
  const Config c = parse_config(
      "train:\n  lr: 0.01\n", kFile,
      {"train.lr=3e-4", "device=cpu", "run.name=hello world", "model.init_from=", "run.seed=42",
       "train.max_steps=+7", "precision.compute=fp16"});
  EXPECT_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.run.name, "hello world");
  EXPECT_EQ(c.model.init_from, "");
  EXPECT_EQ(c.run.seed, 42u);
  EXPECT_EQ(c.train.max_steps, 7);
  EXPECT_EQ(c.precision.compute, "fp16");
  // Cross-field rules apply after all overrides, so one override can fix another's clash.
  EXPECT_EQ(parse_config("", kFile, {"train.seq_len=512", "model.max_seq_len=512"}).train.seq_len,
            512);
  std::string m = parse_error("", {"train.max_step=5"});
  EXPECT_HAS(m, "--set train.max_step=5: unknown key 'train.max_step'");
  EXPECT_HAS(m, "(did you mean 'train.max_steps'?)");
  m = parse_error("", {"train.batch_size=eight"});
  EXPECT_HAS(m, "--set train.batch_size=eight: train.batch_size: expected an integer, got 'eight'");
  m = parse_error("", {"train.lr=-1"});
  EXPECT_HAS(m, "--set train.lr=-1: train.lr = -1 is out of range");
  m = parse_error("", {"attention.backend=flsh"});
  EXPECT_HAS(m, "expected one of baseline|flash|stabilized_flash|cudnn, got 'flsh'");
  EXPECT_HAS(parse_error("", {"trainlr"}), "--set trainlr: expected section.key=value");
  EXPECT_HAS(parse_error("", {"train.seq_len=512"}), "(with --set overrides): train.seq_len");
}

TEST(Config, LoadConfigFromFile) {
  const std::string missing = "/nonexistent/dir/x.yaml";
  EXPECT_EQ(error_of([&] { load_config(missing); }),
            "cannot read config file '/nonexistent/dir/x.yaml': No such file or directory");
  EXPECT_HAS(error_of([] { load_config("/"); }), "cannot read config file '/'");

  char path[] = "/tmp/test_config_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = "train:\n  batch_size: 4\n  lr: 2e-3\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  const Config c = load_config(path, {"train.batch_size=2"});
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.train.batch_size, 2);
  EXPECT_EQ(c.train.lr, 2e-3);
  const std::string m = error_of([&] { load_config(path, {"train.lr=abc"}); });
  EXPECT_EQ(m.rfind(path, 0), 0u) << m;
  std::remove(path);
}

// run.threads is an int that may also be written auto (the default), and reads back as such.
TEST(Config, ThreadsAutoOrCount) {
  EXPECT_EQ(Config{}.run.threads, kAutoInt);
  EXPECT_EQ(parse_config("run:\n  threads: auto\n", "t.yaml").run.threads, kAutoInt);
  EXPECT_EQ(parse_config("run:\n  threads: 3\n", "t.yaml").run.threads, 3);
  const Config c = parse_config("run:\n  threads: auto\n", "t.yaml");
  EXPECT_NE(config_to_yaml(c).find("threads: auto"), std::string::npos);
  EXPECT_EQ(parse_config(config_to_yaml(c), "back.yaml").run.threads, kAutoInt);
  EXPECT_NE(config_help().find("int|auto"), std::string::npos);
}

TEST(Config, YamlRoundTrip) {
  const Config changed = everything_changed();
  // The test config really moves every field (so the round trip below covers each key).
  EXPECT_EQ(diff(changed, Config{}).size(), kAllKeys.size());
  EXPECT_NO_THROW(validate_config(changed));
  for (const Config& c : {Config{}, changed}) {
    const std::string yaml = config_to_yaml(c);
    const Config back = parse_config(yaml, "resolved.yaml");
    const std::vector<std::string> d = diff(back, c);
    EXPECT_TRUE(d.empty()) << "differs in " << (d.empty() ? "" : d[0]) << "\n" << yaml;
    EXPECT_EQ(config_to_yaml(back), yaml);
  }
  // Read by yaml-cpp alone, as another tool would: every key present, doubles exact and in
  // their shortest form, tricky strings still strings.
  const std::string yaml = config_to_yaml(changed);
  const YAML::Node n = YAML::Load(yaml);
  for (const std::string& key : kAllKeys) {
    const size_t dot = key.find('.');
    const YAML::Node v =
        dot == std::string::npos ? n[key] : n[key.substr(0, dot)][key.substr(dot + 1)];
    EXPECT_TRUE(v.IsScalar()) << key;
  }
  EXPECT_EQ(n["data"]["val_fraction"].as<double>(), 0.1 + 0.2);
  EXPECT_EQ(n["train"]["eps"].as<double>(), 5e-324);
  EXPECT_EQ(n["model"]["init_from"].Tag(), "!");  // quoted: not YAML null
  EXPECT_EQ(n["run"]["name"].Tag(), "!");         // quoted: not a YAML 1.1 boolean
  const std::string defaults = config_to_yaml(Config{});
  EXPECT_HAS(defaults, "  lr: 0.001 ");
  EXPECT_HAS(defaults, "  eps: 1e-08 ");
  EXPECT_HAS(defaults, "  loss_scale_init: 65536.0 ");
  EXPECT_HAS(defaults, "  val_path: \"\" ");
  EXPECT_HAS(defaults, "# peak learning rate");
}

TEST(Config, HelpMentionsEveryKey) {
  const std::string help = config_help();
  for (const std::string& key : kAllKeys) EXPECT_HAS(help, "  " + key + " ");
  // One line per key with its type, default and range.
  const size_t at = help.find("  train.lr ");
  ASSERT_NE(at, std::string::npos);
  const std::string line = help.substr(at, help.find('\n', at) - at);
  EXPECT_HAS(line, "float");
  EXPECT_HAS(line, "0.001");
  EXPECT_HAS(line, "(0, 10]");
  EXPECT_HAS(help, "fp32|bf16|fp16|fp64");
  EXPECT_HAS(help, "[1, 96]");
}

// Issue 19: everything after a '---' line was silently ignored (YAML::Load reads the first
// document only).
TEST(Config, MultiDocumentFileIsRefused) {
  const std::string m = parse_error("train: {lr: 0.001}\n---\ntrain: {lr: 5}\n");
  EXPECT_HAS(m, "holds 2 YAML documents (the second starts at line 3");
  EXPECT_HAS(m, "remove the '---'");
  // A leading '---' (one document) is still fine.
  EXPECT_EQ(parse_config("---\ntrain: {lr: 0.002}\n", kFile).train.lr, 0.002);
}

// Issue 19: model.vocab_size up to 1000000 was accepted though token ids are uint16, and
// sizes no machine holds got as far as std::bad_alloc. Ranges follow the token format, and
// a config needing more than 1e12 values, or more than INT_MAX tokens per step, is refused.
TEST(Config, UpperBoundsFollowTheTokenFormatAndMemory) {
  EXPECT_HAS(parse_error("model: {vocab_size: 65537}\n"),
             "model.vocab_size = 65537 is out of range (must be between 1 and 65536)");
  EXPECT_EQ(parse_config("model: {vocab_size: 65536}\n", kFile).model.vocab_size, 65536);
  const std::string help = config_help();
  const size_t at = help.find("  model.vocab_size ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_HAS(help.substr(at, help.find('\n', at) - at), "[1, 65536]");
  EXPECT_HAS(parse_error("model: {max_seq_len: 65536}\n"
                         "train: {batch_size: 4096, seq_len: 65536, grad_accum_steps: 8}\n"),
             "tokens per step is more than 2147483647");
  const std::string m = parse_error(
      "model: {n_layer: 96, n_head: 64, n_embd: 8192, max_seq_len: 65536}\n"
      "train: {batch_size: 64, seq_len: 65536}\n");
  EXPECT_HAS(m, "more than the limit of 1e+12");
  EXPECT_HAS(m, "model.n_layer 96");
  // GPT-2 124M at B=64, T=1024 is well inside.
  EXPECT_NO_THROW(parse_config("model: {n_layer: 12, n_head: 12, n_embd: 768, max_seq_len: 1024,"
                               " vocab_size: 50304}\ntrain: {batch_size: 64, seq_len: 1024}\n",
                               kFile));
}

// Issue 19: a value quoted in an error is a short printable excerpt, not raw bytes.
TEST(Config, BinaryValuesAreEscapedInErrors) {
  const std::string m = parse_error("train: {lr: \"\\x01\\xfe" + std::string(200, 'z') + "\"}\n");
  EXPECT_HAS(m, "expected a number, got '\\x01\\xc3\\xbe");
  EXPECT_HAS(m, "zzz...'");
  EXPECT_LT(m.size(), 200u) << m;
  for (char ch : m) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << m;
}

// Issue 19: a FIFO as the config file blocked load_config until a writer came.
TEST(Config, FifoConfigIsRefusedWithoutBlocking) {
  const std::string fifo = st::test::make_scratch_dir("st_config_fifo_").string() + "/config.yaml";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string msg = st::test::error_without_blocking_on_fifo(fifo, [fifo] { load_config(fifo); });
  EXPECT_HAS(msg, "cannot read config file '" + fifo + "': not a regular file");
}

// Issue 19: dist_memory parsed --ranks with std::stoi: "x" ended in "error: stoi", "2x" was
// taken as 2. A rank count is parsed whole and named in the error.
TEST(ToolArgs, DistMemoryRanksAreParsedWhole) {
  const std::string out = st::test::make_scratch_dir("st_config_tool_").string() + "/err.txt";
  for (const std::string bad : {"x", "2x", "0"}) {
    const int code = st::test::sh(std::string(ST_DIST_MEMORY_BIN) + " --config " ST_CONFIGS_DIR
                                  "/tiny_shakespeare_bytes.yaml --ranks 1," + bad + " >/dev/null 2>" + out);
    const std::string err = st::test::slurp(out);
    EXPECT_EQ(code, 1) << err;
    EXPECT_HAS(err, "dist_memory: error: --ranks: expected rank counts >= 1, got '" + bad + "'");
  }
}
