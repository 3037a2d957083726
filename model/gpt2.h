// GPT-2 with an explicit forward and backward written once as backend calls.
// Parameters live in one flat buffer in llm.c's order (weights stored (out, in)):
//   wte (Vp,C), wpe (maxT,C), ln1w (L,C), ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C),
//   attprojw (L,C,C), attprojb (L,C), ln2w (L,C), ln2b (L,C), fcw (L,4C,C), fcb (L,4C),
//   fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C)
// The LM head is tied to wte. Vocabulary rows [V, Vp) are padding: zero at init, masked
// out of the softmax, never receiving gradient.
//
// Precision (compute = fp32 | bf16 | fp16 | fp64). In bf16/fp16 modes the model keeps, as a
// GPU trainer does: parameters, activations and gradients in the low format; layernorm
// mean/rstd, losses, attention lse and optimizer state (master weights, m, v) in FP32.
// Rounding points are those of the backend methods (core/backend.h): every stored result.
// fp16 uses dynamic loss scaling (optim/loss_scaler.h). fp64 is a reference mode (CPU only).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/attention.h"
#include "core/backend.h"
#include "core/rng.h"
#include "optim/loss_scaler.h"

namespace st {

struct GPT2Config {
  int max_seq_len = 1024;
  int vocab_size = 50257;
  int padded_vocab_size = 0;  // 0: round vocab_size up to a multiple of 128
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  void validate() const;  // throws naming the bad field (check_model_shape's bounds too)
  int vp() const;         // padded vocabulary
};

// Bounds of a model shape (the one place they are set; the ranges of the model.* keys in
// `train --help-config` and the checks of every reader): generous for GPT-2-style models
// (GPT-2 XL: 48 layers, 25 heads, n_embd 1600, 1024 positions, vocabulary 50257) and small
// enough that num_parameters() and byte counts of FP64 arrays of that many values cannot
// overflow 64-bit arithmetic. Shapes read from files (llm.c headers, safetensors,
// checkpoints, a run's config.yaml) are checked against them before anything is sized from
// them. Training vocabularies are further bounded by the token format (kMaxTokenVocab,
// data/shards.h); kMaxVocab bounds weight files' (padded) vocabularies.
inline constexpr int kMaxLayers = 96;
inline constexpr int kMaxHeads = 64;
inline constexpr int kMaxEmbd = 8192;
inline constexpr int kMaxSeqLen = 65536;
inline constexpr int kMaxVocab = 1 << 24;  // padded vocabulary included
// Throws st::Error "<what>: <field> = <value> ..., expected ..." unless 1 <= n_layer <=
// kMaxLayers, 1 <= n_embd <= kMaxEmbd, 1 <= n_head <= kMaxHeads divides n_embd,
// 1 <= max_seq_len <= kMaxSeqLen, 1 <= vocab_size <= kMaxVocab, and padded_vocab_size is 0
// (automatic) or in [vocab_size, kMaxVocab].
void check_model_shape(const GPT2Config& c, const std::string& what);

enum ParamId {
  kWte, kWpe, kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,
  kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb, kLnfw, kLnfb, kNumParams
};
const char* param_name(int id);
std::array<Shape, kNumParams> param_shapes(const GPT2Config& c);
int64_t num_parameters(const GPT2Config& c);  // padded vocabulary included

// The part [begin, end) of the flat parameters whose optimizer state (AdamW m and v, and
// in bf16/fp16 the FP32 master weights) a model keeps; end < 0: all of them. ZeRO-1 gives
// every rank one part (train/trainer.cpp, docs/distributed.md); parameters and gradients
// stay whole on every rank.
struct OptimShard {
  int64_t begin = 0, end = -1;
};

// How backward() adds a micro-batch's gradient to the step's sum (train.grad_accum_mode):
// kFused: every backward kernel adds its contribution into the gradient buffer (dW =
//   round(dW + contribution), llm.c's way); kSeparate: the first micro-batch after
//   zero_grad() writes the buffer as kFused does, every later one is formed from zero in a
//   scratch buffer and then added with one add and one rounding, grads = round(grads + g) --
//   the arithmetic of the data-parallel reduction (dist/comm.h).
enum class GradAccumMode { kFused, kSeparate };

// Elements per partial sum of the CPU backend's sum_squares (layers/reduce_cpu.cpp: FP64
// partial sums of 64K-element chunks, added in order). A sharded gradient norm made of the
// same per-chunk partials, added in the same order, has the same bits; ZeRO-1 shards are
// multiples of it.
inline constexpr int64_t kSumSquaresChunk = int64_t(1) << 16;

// Activation recomputation (train.recompute), llm.c's recompute levels: what backward()
// recomputes instead of keeping from forward(). Every kernel is deterministic, so the
// recomputed values are the forward's bits and losses, gradients and weights are unchanged;
// only memory changes. kGelu keeps one (B,T,4C) GELU output for all layers instead of L;
// kGeluLayernorm also keeps one (B,T,C) buffer each for the ln1 and ln2 outputs (their
// mean and rstd stay per layer).
enum class Recompute { kNone, kGelu, kGeluLayernorm };
Recompute parse_recompute(const std::string& s);  // none | gelu | gelu_layernorm
const char* recompute_name(Recompute r);

// The activation and backward-scratch tensors forward()/backward() allocate for a
// micro-batch of B sequences of T tokens, in allocation order: GPT2::ensure_acts allocates
// exactly this list (so a memory estimate made from it cannot drift from the model), each
// in the backend's storage format of the compute format (stat: of FP32, or FP64 in fp64
// mode). Host int32 tokens/targets are included (stat = false, host = true).
struct ActivationSpec {
  const char* name;
  Shape shape;
  bool stat = false;  // layernorm mean/rstd, lse, losses: FP32 (FP64) storage
  bool host = false;  // host int32 (tokens, targets)
};
std::vector<ActivationSpec> activation_specs(const GPT2Config& c, int B, int T, Recompute r);

// Bytes a GPT2 allocates on `be` (before anything is allocated): parameters, gradients,
// FP32 master weights (bf16/fp16), AdamW m and v (of an optimizer shard of shard_numel
// values; < 0: all), the kSeparate scratch gradient buffer when later micro-batches
// use it, and the activations of activation_specs.
struct ModelMemory {
  int64_t params = 0, grads = 0, master = 0, adam_mv = 0, grad_scratch = 0, activations = 0;
  int64_t total() const { return params + grads + master + adam_mv + grad_scratch + activations; }
};
ModelMemory model_memory(const GPT2Config& c, const Backend& be, DType compute, int B, int T,
                         Recompute r, bool separate_grad_scratch, int64_t shard_numel = -1);

struct OptimConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.0f;  // applied to 2-D weights only (wte, wpe, qkvw, ...)
  float grad_clip = 1.0f;     // global-norm clip; <= 0 disables
};

struct StepStats {
  double grad_norm = 0.0;  // unscaled, before clipping
  bool skipped = false;    // fp16 overflow: update skipped, scale halved
  float loss_scale = 1.0f;
};

// What one layer's attention saw in the backward pass (all (B, T, ...) views of the
// backend's tensors, valid only during the call): the stability hooks recompute the
// attention from these (train/hooks.h).
struct AttentionTaps {
  int layer = 0;
  Tensor qkv;   // (B, T, 3C) attention input
  Tensor out;   // (B, T, C) stored O
  Tensor dout;  // (B, T, C) gradient arriving at O
  Tensor ln1;   // (B, T, C) layernorm output feeding the QKV projection
};
using AttentionObserver = std::function<void(const AttentionTaps&)>;

class GPT2 {
 public:
  // attn: one config for every layer, or one per layer (per-layer backends and overrides).
  // shard: the optimizer state kept here (OptimShard; default all of it).
  GPT2(const GPT2Config& cfg, Backend& backend, DType compute,
       const std::vector<AttentionConfig>& attn, const LossScalerConfig& ls = {},
       const OptimShard& shard = {});
  GPT2(const GPT2Config& cfg, Backend& backend, DType compute,
       const AttentionConfig& attn = AttentionConfig{}, const LossScalerConfig& ls = {},
       const OptimShard& shard = {})
      : GPT2(cfg, backend, compute, std::vector<AttentionConfig>{attn}, ls, shard) {}
  const GPT2Config& config() const { return cfg_; }
  DType compute() const { return compute_; }
  Backend& backend() { return be_; }
  int64_t num_params() const { return nparams_; }

  // GPT-2 initialisation: N(0, 0.02); attproj and fcproj N(0, 0.02/sqrt(2L)); biases 0;
  // layernorm weights 1; padded vocabulary rows 0. Drawn in FP64 from Rng(seed).
  void init_weights(uint64_t seed);
  // Master weights from / to a host FP32 flat array of num_params() values (llm.c order).
  // Sharded with a separate master (bf16/fp16): set_master_fp32 keeps the shard's part and
  // rounds all of it into the parameters; master_fp32 asks the source set with
  // set_master_source (the trainer gathers the shards), and throws without one.
  void set_master_fp32(const std::vector<float>& flat);
  std::vector<float> master_fp32() const;
  void set_master_source(std::function<std::vector<float>()> source) {
    master_source_ = std::move(source);
  }

  // tokens, targets: host int32 (B*T). Returns the mean loss (targets given) or NaN;
  // mean_loss() keeps it in FP64 (summed in order over positions).
  // Activations are (re)allocated when B or T change; T <= max_seq_len.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  double mean_loss() const { return mean_loss_; }
  void zero_grad();
  // Backward of the last forward. grad_accum_steps divides the loss so that micro-steps
  // accumulate the mean gradient; the loss scale (fp16) multiplies it. The gradient joins
  // the sum as set_grad_accum_mode says (default kFused).
  void backward(int grad_accum_steps = 1);
  // A training micro-step: forward(tokens, targets, B, T) then backward(grad_accum_steps),
  // with the classifier run once: its one pass over the logits writes the losses and
  // dlogits (over the logits), where forward() + backward() run a loss-only pass and then
  // the loss+dlogits pass. Losses, gradients and mean_loss() are the bits of forward() +
  // backward(); the loss is read back after the backward is queued. backward() may not
  // follow it.
  float forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T,
                         int grad_accum_steps = 1);
  void set_grad_accum_mode(GradAccumMode m) { accum_mode_ = m; }
  // Takes effect at the next forward (activations are reallocated).
  void set_recompute(Recompute r);
  Recompute recompute() const { return recompute_; }
  // Bytes of activation and backward-scratch tensors allocated for the current B and T.
  size_t activation_bytes() const;
  GradAccumMode grad_accum_mode() const { return accum_mode_; }
  // Clip, AdamW with lr, zero nothing (call zero_grad before the next accumulation).
  // sum_squares: grad_sum_squares() when the caller already has it (saves a pass); required
  // when sharded (the global sum over every rank's shard). Sharded, only the shard's
  // parameters are updated (the caller gathers the others).
  StepStats step(float lr, const OptimConfig& opt, std::optional<double> sum_squares = {});
  // Sum of squares of the (loss-scaled) gradients, in FP64.
  double grad_sum_squares() const { return be_.sum_squares(grads_flat_); }
  // The kSumSquaresChunk partial sums of the gradients in [begin, end) (begin a multiple
  // of kSumSquaresChunk): added in order they give grad_sum_squares() over that range.
  std::vector<double> grad_sum_squares_chunks(int64_t begin, int64_t end) const;

  // Instrumentation. The observer (when set) is called in backward() for every layer,
  // right before that layer's attention backward. Attention statistics are collected in
  // forward() while enabled (Attention::stats()).
  void set_attention_observer(AttentionObserver obs) { observer_ = std::move(obs); }
  void set_collect_attention_stats(bool on);
  const std::vector<AttentionConfig>& attention_configs() const { return attn_cfg_; }

  // Views for tests and tools (storage dtype of the backend).
  Tensor param(int id) const { return params_[id]; }
  const Attention& attention(int layer) const { return *attn_.at(layer); }
  Tensor grad(int id) const { return grads_[id]; }
  Tensor grads_flat() const { return grads_flat_; }
  const Tensor& logits() const { return acts_.logits; }  // (B,T,Vp) after forward
  const Tensor& losses() const { return acts_.losses; }  // (B,T)
  int adam_step() const { return adam_t_; }
  LossScaler& loss_scaler() { return scaler_; }
  // Optimizer state, for checkpoints: master (FP32), m, v flat views of the shard
  // [shard_begin(), shard_end()) (the whole array unless sharded).
  Tensor master_flat() const;
  Tensor m_flat() const { return m_; }
  Tensor v_flat() const { return v_; }
  Tensor params_flat() const { return params_flat_; }  // all parameters, compute storage
  bool sharded() const { return shard_begin_ != 0 || shard_end_ != nparams_; }
  bool separate_master() const { return separate_master_; }  // bf16/fp16: FP32 master copy
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  // Bytes of optimizer state allocated here: m and v, plus the master weights where they
  // are not the parameters themselves (bf16/fp16).
  size_t optimizer_bytes() const;
  void set_adam_step(int t) { adam_t_ = t; }
  // Copies master weights into the compute parameters (rounding to the compute format).
  void sync_params_from_master();

 private:
  struct Acts {
    int B = 0, T = 0;
    Tensor tokens, targets;  // host int32 (B,T)
    Tensor encoded;          // (B,T,C)
    // per layer, stacked on axis 0
    Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, lse, attproj, residual2, ln2, ln2_mean,
        ln2_rstd, fch, fch_gelu, fcproj, residual3;
    Tensor lnf, lnf_mean, lnf_rstd, logits, losses;
    // backward scratch
    Tensor dresidual, dbtc, dbt4c, dqkv, datty;
  };
  void ensure_acts(int B, int T);
  void forward_trunk(const int32_t* tokens, int B, int T);  // up to the logits
  void backward_pass(int grad_accum_steps);  // the classifier's loss+dlogits pass onwards
  float fetch_mean_loss();                   // mean_loss_ from the losses on the device
  Tensor residual_in(int layer) const;
  // Layer l's activations that recomputation may share between layers.
  Tensor ln1(int l) const { return recompute_ == Recompute::kGeluLayernorm ? acts_.ln1[0] : acts_.ln1[l]; }
  Tensor ln2(int l) const { return recompute_ == Recompute::kGeluLayernorm ? acts_.ln2[0] : acts_.ln2[l]; }
  Tensor fch_gelu(int l) const { return recompute_ != Recompute::kNone ? acts_.fch_gelu[0] : acts_.fch_gelu[l]; }

  GPT2Config cfg_;
  Backend& be_;
  DType compute_, storage_, stat_;
  std::vector<std::unique_ptr<Attention>> attn_;  // one per layer
  std::vector<AttentionConfig> attn_cfg_;          // one per layer
  AttentionObserver observer_;
  int64_t nparams_ = 0;
  std::array<int64_t, kNumParams> offsets_{};
  Tensor params_flat_, grads_flat_, master_, m_, v_;
  std::array<Tensor, kNumParams> params_, grads_;
  int64_t shard_begin_ = 0, shard_end_ = 0;
  bool separate_master_ = false;
  GradAccumMode accum_mode_ = GradAccumMode::kFused;
  Recompute recompute_ = Recompute::kNone;
  bool grads_zero_ = true;  // no backward since zero_grad()
  Tensor scratch_flat_;     // kSeparate: a later micro-batch's gradient
  std::array<Tensor, kNumParams> scratch_;
  std::function<std::vector<float>()> master_source_;
  Acts acts_;
  LossScaler scaler_;
  int adam_t_ = 0;
  bool has_targets_ = false;
  double mean_loss_ = 0.0;  // the last forward computed losses for backward
};

}  // namespace st
