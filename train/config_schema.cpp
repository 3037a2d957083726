// The config schema: every key of the YAML config declared once, with the field it sets,
// its range, its one-line description (also config.yaml's comment and `train --help-config`'s
// text) and, for enums, its choices. Adding a key is one struct field in config.h plus one
// line here; defaults are not repeated: they come from the struct initialisers in config.h.
#include "train/config_schema.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "data/shards.h"
#include "io/checkpoint.h"

namespace st::detail {
namespace {

// clang-format off
constexpr Bounds any() { return {}; }
constexpr Bounds closed(double lo, double hi) { return {lo, hi, false, false}; }       // [lo, hi]
constexpr Bounds at_least(double lo) { return {lo, kInf, false, false}; }              // [lo, inf)
constexpr Bounds open_closed(double lo, double hi) { return {lo, hi, true, false}; }   // (lo, hi]
constexpr Bounds closed_open(double lo, double hi) { return {lo, hi, false, true}; }   // [lo, hi)
constexpr Bounds open(double lo, double hi) { return {lo, hi, true, true}; }           // (lo, hi)

// A key `section.key`: its name and the field of Config it sets.
#define ST_KEY(sec, key) #sec "." #key, [](Config& c) -> Ref { return &c.sec.key; }
// clang-format on

constexpr const char* kFormats = "auto|bf16|fp16|fp32|fp64";

// Order here is the order of config_to_yaml and config_help. Top-level keys come first.
const Key kKeys[] = {
    {"device", [](Config& c) -> Ref { return &c.device; }, any(),
     "where to run; auto: cuda when a GPU is there, else cpu", "auto|cpu|cuda"},

    {ST_KEY(run, name), any(), "run name, shown in logs"},
    {ST_KEY(run, out_dir), any(), "run directory: resolved config, logs, checkpoints"},
    {ST_KEY(run, seed), any(), "seed for initialisation, data order and sampling"},
    {ST_KEY(run, threads), closed(0, 1024),
     "CPU threads; auto: the fastest count, re-measured during the run; 0: all cores",
     nullptr, true},

    {ST_KEY(model, n_layer), closed(1, kMaxLayers), "transformer blocks"},
    {ST_KEY(model, n_head), closed(1, kMaxHeads), "attention heads; must divide n_embd"},
    {ST_KEY(model, n_embd), closed(1, kMaxEmbd), "residual stream width C"},
    {ST_KEY(model, max_seq_len), closed(1, kMaxSeqLen), "rows of the position embedding"},
    {ST_KEY(model, vocab_size), closed(1, kMaxTokenVocab),
     "vocabulary: 256 byte, 50257 gpt2; at most 65536 (token ids are stored as uint16)"},
    {ST_KEY(model, init_from), any(),
     "initial weights: llm.c model, safetensors or checkpoint; empty: from run.seed"},

    {ST_KEY(data, train_path), any(), "training text file, or llm.c token shards (.bin or glob)"},
    {ST_KEY(data, val_path), any(), "validation text or shards; empty: end of a text train_path"},
    {ST_KEY(data, format), any(), "how paths are read; auto: glob or *.bin are shards",
     "auto|text|shards"},
    {ST_KEY(data, tokenizer), any(), "byte-level or GPT-2 BPE tokenizer", "byte|gpt2"},
    {ST_KEY(data, tokenizer_dir), any(), "folder with GPT-2's encoder.json and vocab.bpe"},
    {ST_KEY(data, prepare_from), any(),
     "text file to write missing train/val shards from (prepare_data's rules); empty: never"},
    {ST_KEY(data, val_fraction), open_closed(0, 0.5), "held-out share when val_path is empty"},

    // At most kMaxCheckpointStep: checkpoint names hold 8 digits. (The descriptions are
    // config.yaml's comments, which checkpoints record: unchanged keeps runs' bytes.)
    {ST_KEY(train, max_steps), closed(1, kMaxCheckpointStep), "optimizer steps"},
    {ST_KEY(train, batch_size), closed(1, 4096), "micro-batch size B"},
    {ST_KEY(train, seq_len), closed(1, kMaxSeqLen),
     "tokens per sequence T; at most model.max_seq_len"},
    {ST_KEY(train, grad_accum_steps), closed(1, 4096), "micro-batches per optimizer step"},
    {ST_KEY(train, lr), open_closed(0, 10), "peak learning rate, after warmup"},
    {ST_KEY(train, min_lr), closed(0, 10), "learning rate at the end of the decay; <= lr"},
    {ST_KEY(train, warmup_steps), at_least(0), "linear warmup steps"},
    {ST_KEY(train, beta1), closed_open(0, 1), "AdamW first-moment decay"},
    {ST_KEY(train, beta2), closed_open(0, 1), "AdamW second-moment decay"},
    {ST_KEY(train, eps), open(0, 1), "AdamW epsilon"},
    {ST_KEY(train, weight_decay), closed(0, 10), "AdamW decoupled weight decay"},
    {ST_KEY(train, grad_clip), at_least(0), "global gradient-norm clip; 0: off"},
    {ST_KEY(train, ckpt_every), at_least(0), "checkpoint every N steps; 0: at the end"},
    {ST_KEY(train, keep_checkpoints), at_least(0), "newest N kept; 0: keep all"},
    {ST_KEY(train, eval_every), at_least(0), "validation loss every N steps; 0: at the end"},
    {ST_KEY(train, eval_batches), at_least(1), "micro-batches per validation loss"},
    {ST_KEY(train, log_every), at_least(1), "console progress line every N steps"},
    {ST_KEY(train, sample_tokens), at_least(0), "tokens sampled at the end of the run; 0: none"},
    {ST_KEY(train, grad_accum_mode), any(),
     "micro-batch gradients: fused into the buffer, or separate (one add each: the DP sum)",
     "fused|separate"},
    {ST_KEY(train, recompute), any(),
     "activations recomputed in backward instead of kept (memory; same bits)",
     "none|gelu|gelu_layernorm"},

    {ST_KEY(precision, compute), any(), "compute precision; fp64: reference",
     "fp32|bf16|fp16|fp64"},
    // 1..2^24: the fp16 loss scaler's bounds (optim/loss_scaler.h).
    {ST_KEY(precision, loss_scale_init), closed(1, 16777216), "initial loss scale (fp16)"},
    {ST_KEY(precision, loss_scale_growth_interval), at_least(1),
     "clean steps before the loss scale doubles (fp16 only)"},

    {ST_KEY(attention, backend), any(), "implementation (cudnn: GPU only, NVIDIA's kernel)",
     "baseline|flash|stabilized_flash|cudnn"},
    {ST_KEY(attention, rule), any(), "rounding rule for the formats below",
     "gpu|every_op|every_mac"},
    {ST_KEY(attention, qkv), any(), "format of Q, K, V; auto: from rule", kFormats},
    {ST_KEY(attention, scores), any(), "format of the scores S", kFormats},
    {ST_KEY(attention, probs), any(), "format of P (baseline) / P~ fed to P~V (flash)", kFormats},
    {ST_KEY(attention, accum), any(), "flash O~ accumulator and rescale factor; baseline exp(S-m)", kFormats},
    {ST_KEY(attention, lsum), any(), "softmax row sum l; auto: as accum", kFormats},
    {ST_KEY(attention, lsum_mac), any(), "partial sums of l over a key tile; auto: as mac", kFormats},
    {ST_KEY(attention, out), any(), "format of the stored O", kFormats},
    {ST_KEY(attention, mac), any(), "partial sums inside the matmuls", kFormats},
    {ST_KEY(attention, grads), any(), "format of dQ, dK, dV, dS, dP", kFormats},
    {ST_KEY(attention, delta), any(), "how the backward forms delta",
     "o|o_split|o_fp32|dp_p|fp32_recompute"},
    {ST_KEY(attention, o_tilde_bits), closed(0, 21),
     "flash: fraction bits of O~ (FP32 exponent range; bf16 has 7) to amplify Qiu & Yao's "
     "cause; 0: O~ in accum's format (CPU only)"},
    {ST_KEY(attention, o_tilde_gain), at_least(0),
     "flash: the O~ update's rounding error times this gain (>= 1), O~ held in fp32: "
     "Qiu & Yao's cause scaled; 0: off (CPU only)"},
    {ST_KEY(attention, o_tilde_scope), any(),
     "which O~ updates o_tilde_bits or o_tilde_gain amplify: every key tile, tiles whose maximum is tied "
     "(within tie_tol), or as many untied tiles as tied ones (the control; CPU only)",
     "all|tied|untied_matched"},
    {ST_KEY(attention, tie_break), at_least(0),
     "flash: in a tied key tile the j-th tied score enters exp lowered by j*tie_break (the "
     "ties-broken counterfactual); 0: off (CPU only)"},
    {ST_KEY(attention, block_q), closed(0, 65536), "flash query tile Br; 0: one tile"},
    {ST_KEY(attention, block_k), closed(0, 65536), "flash key tile Bc; 0: one tile per row"},
    {ST_KEY(attention, beta), closed(1, 64), "stabilized flash: shift factor beta"},
    {ST_KEY(attention, tie_tol), closed(0, 1), "stabilized flash: tie tolerance on scores"},
    {ST_KEY(attention, tie_shift), any(), "stabilized flash: shifted maximum of tied tiles",
     "beta|exact_sum"},
    {ST_KEY(attention, cuda_kernel), any(),
     "CUDA flash kernels: mma_sync (sm_80+) or sm90 (Hopper: TMA, wgmma, forward and "
     "backward; tiles block_q = block_k = 128; verified on the SIMT emulator, not yet on a GPU)",
     "mma_sync|sm90"},
    {ST_KEY(attention, max_shift), at_least(0),
     "stabilized flash: cap on the max shift; 0: ln(1/min_normal(probs))/2"},
    {ST_KEY(attention, layer_backends), any(),
     "per-layer backend, e.g. '2:flash,5:cudnn' (layers from 0)"},
    {ST_KEY(attention, fp32_out_heads), any(),
     "layer.head pairs with FP32 stored O, e.g. '2.8,2.3'"},

    {ST_KEY(hooks, every), at_least(0),
     "stability hooks every N steps and at every checkpoint; 0: off"},
    {ST_KEY(hooks, spectral), any(), "spectral.csv: sigma_max of every weight matrix and head slice"},
    {ST_KEY(hooks, power_tol), open(0, 1),
     "power iteration: stop when the relative residual of A^T A v is <= tol"},
    {ST_KEY(hooks, power_iters), closed(1, 100000), "power iteration: cap per matrix per call"},
    {ST_KEY(hooks, grad_norms), any(), "grad_norms.csv: gradient norm of every slice"},
    {ST_KEY(hooks, attn_stats), any(), "attn_stats.csv: max logit, ties, P=1 count, entropy"},
    {ST_KEY(hooks, delta_drift), any(),
     "delta_drift.csv: delta and dW_Q error vs an FP64 recompute (Qiu & Yao)"},
    {ST_KEY(hooks, drift_rows), at_least(0),
     "delta drift: sequences of the micro-batch recomputed; 0: all"},
    {ST_KEY(hooks, reference_run), any(),
     "run directory; at each checkpoint, W1 / max|dW| vs its same-step checkpoint"},
    {ST_KEY(hooks, spike_z), at_least(0),
     "loss/grad-norm spike: z-score above this; 0: detection off"},
    {ST_KEY(hooks, spike_window), closed(2, 1000000), "spike detection: steps in the running window"},
    {ST_KEY(hooks, spike_warmup), at_least(2), "spike detection: steps seen before it can fire"},
    {ST_KEY(hooks, spike_snapshot), any(),
     "on a spike, write spike_ckpt_N.bin: the state before the update"},
    {ST_KEY(hooks, spike_skip), any(), "on a spike, skip the update"},

    {ST_KEY(dist, backend), any(),
     "data parallelism; auto: mpi under mpirun (nccl with device cuda), else none",
     "auto|none|mpi|nccl"},
    {ST_KEY(dist, zero), closed(0, 1), "1: ZeRO-1, AdamW state and master weights sharded"},
    {ST_KEY(dist, timeout_s), open(0, 1e7),
     "a collective or rendezvous taking longer ends every rank with an error"},
    {ST_KEY(dist, nccl_bootstrap), any(), "how rank 0's NCCL id reaches the others",
     "mpi|file|tcp"},
    {ST_KEY(dist, rendezvous), any(), "nccl_bootstrap file: shared path; tcp: host:port"},
};
#undef ST_KEY

const char* const kSectionNames[] = {"run",       "model",     "data",  "train",
                                     "precision", "attention", "hooks", "dist"};

}  // namespace

const Table<Key> kSchema{kKeys, std::size(kKeys)};
const Table<const char*> kSections{kSectionNames, std::size(kSectionNames)};

std::string section_of(const Key& k) {
  const char* dot = std::strchr(k.name, '.');
  return dot ? std::string(k.name, dot) : std::string();
}
std::string leaf_of(const Key& k) {
  const char* dot = std::strchr(k.name, '.');
  return dot ? dot + 1 : k.name;
}
bool is_section(const std::string& s) {
  return std::find(std::begin(kSections), std::end(kSections), s) != std::end(kSections);
}
const Key* find_key(const std::string& name) {
  for (const Key& k : kSchema)
    if (name == k.name) return &k;
  return nullptr;
}

size_t type_of(const Key& k) {
  static Config probe;
  return k.ref(probe).index();
}

}  // namespace st::detail
