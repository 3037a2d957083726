// Training configuration: one struct per YAML section. The schema (key, type, default,
// range, description) is declared once in config.cpp and drives parsing, validation,
// `--set section.key=value` overrides, the resolved config.yaml and `train --help-config`.
// Unknown keys, wrong types and out-of-range values throw st::Error naming the key and file.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/attention.h"
#include "data/dataset.h"
#include "model/gpt2.h"
#include "optim/loss_scaler.h"

namespace YAML {
class Node;  // yaml-cpp
}

namespace st {

// An int key written `auto` in YAML (run.threads).
constexpr int kAutoInt = -1;

// Upper bounds of the model shape: kMaxLayers, kMaxHeads, kMaxEmbd, kMaxSeqLen of
// model/gpt2.h (the ranges of these keys in `train --help-config`; readers of a run directory
// check a run's config.yaml against them). model.vocab_size is bounded by the token format:
// kMaxTokenVocab in data/shards.h.
struct RunSection {
  std::string name = "run";
  std::string out_dir = "runs/run";  // the run directory
  uint64_t seed = 1337;
  int threads = kAutoInt;            // CPU threads; kAutoInt: auto (ThreadTuner); 0: all cores
};

struct ModelSection {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int max_seq_len = 256;
  int vocab_size = 256;  // byte-level default; GPT-2 BPE uses 50257
  std::string init_from;  // empty: GPT-2 initialisation from run.seed
};

struct DataSection {
  // A text file, or llm.c token shards: a .bin file or a glob (data/dataset.h).
  std::string train_path = "../shared/data/tinyshakespeare.txt";
  std::string val_path;            // empty: the last val_fraction of a text train_path
  std::string format = "auto";     // auto (glob or *.bin: shards) | text | shards
  std::string tokenizer = "byte";  // byte | gpt2
  std::string tokenizer_dir = "../shared/data/gpt2-tokenizer";  // encoder.json, vocab.bpe
  std::string prepare_from;        // text file that missing shards are prepared from
  double val_fraction = 0.1;
};

struct TrainSection {
  int max_steps = 1000;
  int batch_size = 8;        // micro-batch B
  int seq_len = 128;         // T
  int grad_accum_steps = 1;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int warmup_steps = 50;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;    // global-norm clip; 0 disables clipping
  int ckpt_every = 200;      // steps; 0: only at the end
  int keep_checkpoints = 2;  // newest N kept; 0 keeps all
  int eval_every = 100;      // steps; 0: only at the end
  int eval_batches = 8;
  int log_every = 1;         // console progress line every N steps
  int sample_tokens = 200;   // text sample at the end of the run; 0 disables
  // How a micro-batch's gradient joins the step's sum: fused (each backward kernel adds its
  // contribution into the gradient buffer, as llm.c does) or separate (the micro-batch's
  // gradient is formed from zero, then added with one add + rounding: the arithmetic of the
  // data-parallel reduction, docs/distributed.md).
  std::string grad_accum_mode = "fused";
  std::string recompute = "none";  // activation recomputation (model/gpt2.h Recompute)
};

struct PrecisionSection {
  std::string compute = "fp32";  // fp32 | bf16 | fp16 | fp64
  double loss_scale_init = 65536.0;  // fp16 only
  int loss_scale_growth_interval = 2000;
};

struct AttentionSection {
  std::string backend = "baseline";  // baseline | flash | stabilized_flash
  std::string rule = "gpu";          // gpu | every_op | every_mac (core/attention_numerics.h)
  // Per-point format overrides: auto (from the rule and precision.compute) | bf16 | fp16 |
  // fp32 | fp64.
  std::string qkv = "auto", scores = "auto", probs = "auto", accum = "auto", out = "auto",
              mac = "auto", grads = "auto";
  // The softmax row sum l and its partial sums; auto: follow accum and mac.
  std::string lsum = "auto", lsum_mac = "auto";
  std::string delta = "o";  // o | o_split | o_fp32 | dp_p | fp32_recompute
  int o_tilde_bits = 0;     // flash: O~ with this many fraction bits; 0: in accum's format
  double o_tilde_gain = 0;  // flash: O~'s rounding error times this (>= 1); 0: off
  std::string o_tilde_scope = "all";  // all | tied | untied_matched (core/attention_numerics.h)
  double tie_break = 0;     // flash: tied scores lowered by j * tie_break before exp; 0: off
  int block_q = 64, block_k = 64;  // flash tiles; 0: one tile per row
  double beta = 2.0, tie_tol = 1e-3, max_shift = 0.0;
  std::string tie_shift = "beta";  // beta | exact_sum (core/attention.h)
  std::string cuda_kernel = "mma_sync";  // mma_sync | sm90 (core/attention.h FlashKernel)
  std::string layer_backends;  // "2:flash,5:stabilized_flash": backend for listed layers
  std::string fp32_out_heads;  // "2.8,2.3": layer.head pairs whose stored O is FP32
};

// Stability instrumentation (train/hooks.h, file formats in docs/run_files.md).
struct HooksSection {
  int every = 100;  // hooks every N steps and at every checkpoint; 0: off
  bool spectral = true;
  double power_tol = 1e-4;  // relative residual ||A^T A v - rho v|| / rho
  int power_iters = 1000;
  bool grad_norms = true;
  bool attn_stats = true;
  bool delta_drift = true;
  int drift_rows = 0;  // 0: every sequence of the step's last micro-batch
  std::string reference_run;
  double spike_z = 6.0;  // 0: off
  int spike_window = 100;
  int spike_warmup = 20;
  bool spike_snapshot = false;
  bool spike_skip = false;
};

// Data-parallel training across processes, GPUs and nodes (docs/distributed.md).
struct DistSection {
  std::string backend = "auto";        // auto | none | mpi | nccl
  int zero = 0;                        // 1: ZeRO-1, optimizer state sharded across ranks
  double timeout_s = 300.0;            // any collective operation (or rendezvous) longer: error
  std::string nccl_bootstrap = "mpi";  // mpi | file | tcp: how NCCL's unique id is shared
  std::string rendezvous;              // file: shared path; tcp: host:port of rank 0
};

struct Config {
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainSection train;
  PrecisionSection precision;
  AttentionSection attention;
  HooksSection hooks;
  DistSection dist;
  std::string device = "auto";  // auto | cpu | cuda
  std::string source;           // file the config came from (for error messages)
};

// Loads FILE, then applies overrides "section.key=value" (or "device=cpu") in order.
// Every error names the key and the file (or "--set" for an override) and says the fix.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Parses YAML text (for tests); `source` names it in errors.
Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {});
// Re-checks every key's range and the cross-key rules (n_embd % n_head == 0, seq_len <=
// max_seq_len, min_lr <= lr, vocab_size covers the tokenizer) for a Config built or edited
// in code; parse_config already does. Errors start with c.source.
void validate_config(const Config& c);
// The fully resolved config as YAML (every key, in schema order); parse_config of the
// result gives back an identical Config.
std::string config_to_yaml(const Config& c);
// The per-layer attention configs (attention.* with layer_backends and fp32_out_heads
// applied); parse_config and validate_config have checked them. Errors name the key and
// c.source.
std::vector<AttentionConfig> attention_configs(const Config& c);
// The same with `where` ("file: ") starting every error (validate_config's prefix).
std::vector<AttentionConfig> attention_configs(const Config& c, const std::string& where);
// The model shape of the model section.
GPT2Config model_config(const Config& c);
// The rest of what the modules below need, from a parsed config: the trainer reads the
// config's text values only through these.
DataSpec data_spec(const Config& c);                  // data.*
LossScalerConfig loss_scaler_config(const Config& c);  // precision.loss_scale_*
DType compute_format(const Config& c);                // precision.compute
GradAccumMode grad_accum_mode(const Config& c);       // train.grad_accum_mode
Recompute recompute_mode(const Config& c);            // train.recompute
// Human-readable documentation of every key (type, default, range, description).
std::string config_help();
// "section.key" -> value text for every leaf of a YAML document (a config.yaml, a
// checkpoint's config_yaml), for comparing configs (resume, ranks, apps/compare): nested
// mappings join their keys with '.', a sequence is its flow text ("[a, b]"), a null "" (a
// bare scalar document is the key ""). Throws YAML::Exception on a key that is not text.
std::map<std::string, std::string> flatten_yaml(const YAML::Node& doc);

}  // namespace st
