// GPT-2 forward and backward as a sequence of backend calls (see gpt2.h for the layout
// and precision rules). No #ifdef CUDA here: the backend decides where each call runs.
#include "model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace st {

void GPT2Config::validate() const {
  ST_CHECK(n_layer > 0, "model.n_layer must be positive, got ", n_layer);
  ST_CHECK(n_head > 0, "model.n_head must be positive, got ", n_head);
  ST_CHECK(n_embd > 0 && n_embd % n_head == 0, "model.n_embd (", n_embd,
           ") must be a positive multiple of model.n_head (", n_head, ")");
  ST_CHECK(vocab_size > 0, "model.vocab_size must be positive, got ", vocab_size);
  ST_CHECK(max_seq_len > 0, "model.max_seq_len must be positive, got ", max_seq_len);
  ST_CHECK(padded_vocab_size == 0 || padded_vocab_size >= vocab_size,
           "model.padded_vocab_size (", padded_vocab_size, ") is below vocab_size (",
           vocab_size, ")");
  check_model_shape(*this, "model");
}

void check_model_shape(const GPT2Config& c, const std::string& what) {
  auto range = [&](const char* field, int64_t v, int64_t hi) {
    if (v < 1 || v > hi)
      fail(what, ": ", field, " = ", v, " is out of range, expected 1..", hi,
           " (a damaged file or not a GPT-2 model)");
  };
  range("n_layer", c.n_layer, kMaxLayers);
  range("n_embd", c.n_embd, kMaxEmbd);
  range("n_head", c.n_head, kMaxHeads);
  if (c.n_embd % c.n_head != 0)
    fail(what, ": n_embd = ", c.n_embd, " is not divisible by n_head = ", c.n_head,
         " (each head gets n_embd / n_head channels)");
  range("max_seq_len", c.max_seq_len, kMaxSeqLen);
  range("vocab_size", c.vocab_size, kMaxVocab);
  if (c.padded_vocab_size != 0 &&
      (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size > kMaxVocab))
    fail(what, ": padded_vocab_size = ", c.padded_vocab_size, " is out of range, expected 0 "
         "(automatic) or vocab_size (", c.vocab_size, ") to ", kMaxVocab);
}

int GPT2Config::vp() const {
  return padded_vocab_size > 0 ? padded_vocab_size : (vocab_size + 127) / 128 * 128;
}

const char* param_name(int id) {
  static const char* names[kNumParams] = {
      "wte",  "wpe", "ln1w",     "ln1b",    "qkvw", "qkvb", "attprojw", "attprojb",
      "ln2w", "ln2b", "fcw",     "fcb",     "fcprojw", "fcprojb", "lnfw", "lnfb"};
  return id >= 0 && id < kNumParams ? names[id] : "?";
}

std::array<Shape, kNumParams> param_shapes(const GPT2Config& c) {
  const int64_t L = c.n_layer, C = c.n_embd;
  return {Shape{c.vp(), C}, Shape{c.max_seq_len, C}, Shape{L, C},     Shape{L, C},
          Shape{L, 3 * C, C}, Shape{L, 3 * C},       Shape{L, C, C},  Shape{L, C},
          Shape{L, C},       Shape{L, C},            Shape{L, 4 * C, C}, Shape{L, 4 * C},
          Shape{L, C, 4 * C}, Shape{L, C},           Shape{C},        Shape{C}};
}

int64_t num_parameters(const GPT2Config& c) {
  int64_t n = 0;
  for (const auto& s : param_shapes(c)) n += shape_numel(s);
  return n;
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::kNone;
  if (s == "gelu") return Recompute::kGelu;
  if (s == "gelu_layernorm") return Recompute::kGeluLayernorm;
  fail("train.recompute: unknown value '", s, "' (expected none, gelu or gelu_layernorm)");
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kGelu: return "gelu";
    case Recompute::kGeluLayernorm: return "gelu_layernorm";
  }
  return "?";
}

namespace {
bool is_decayed(int id) {  // 2-D weights; biases and layernorm parameters are not decayed
  return id == kWte || id == kWpe || id == kQkvw || id == kAttprojw || id == kFcw ||
         id == kFcprojw;
}
}  // namespace

GPT2::GPT2(const GPT2Config& cfg, Backend& backend, DType compute,
           const std::vector<AttentionConfig>& attn, const LossScalerConfig& ls,
           const OptimShard& shard)
    : cfg_(cfg), be_(backend), compute_(compute) {
  cfg_.validate();
  cfg_.padded_vocab_size = cfg_.vp();
  ST_CHECK(compute != DType::I32, "precision.compute cannot be int32");
  ST_CHECK(compute != DType::F64 || be_.device() == Device::CPU,
           "precision.compute fp64 is a CPU reference mode; use device: cpu");
  storage_ = be_.storage_dtype(compute_);
  stat_ = be_.storage_dtype(compute_ == DType::F64 ? DType::F64 : DType::F32);
  const DType master_dtype = compute_ == DType::F64 ? DType::F64 : DType::F32;

  const auto shapes = param_shapes(cfg_);
  int64_t off = 0;
  for (int i = 0; i < kNumParams; ++i) {
    offsets_[i] = off;
    off += shape_numel(shapes[i]);
  }
  nparams_ = off;
  shard_begin_ = shard.begin;
  shard_end_ = shard.end < 0 ? nparams_ : shard.end;
  ST_CHECK(shard_begin_ >= 0 && shard_begin_ <= shard_end_ && shard_end_ <= nparams_,
           "optimizer shard [", shard.begin, ", ", shard.end, ") of ", nparams_, " parameters");
  const int64_t ns = shard_end_ - shard_begin_;
  params_flat_ = be_.alloc({nparams_}, storage_);
  grads_flat_ = be_.alloc({nparams_}, storage_);
  separate_master_ = compute_ == DType::BF16 || compute_ == DType::F16;
  master_ = separate_master_ ? be_.alloc({ns}, master_dtype) : params_flat_;
  m_ = be_.alloc({ns}, master_dtype);
  v_ = be_.alloc({ns}, master_dtype);
  for (const Tensor* t : {&params_flat_, &grads_flat_, &master_, &m_, &v_}) be_.zero(*t);
  for (int i = 0; i < kNumParams; ++i) {
    const int64_t n = shape_numel(shapes[i]);
    params_[i] = params_flat_.flat(offsets_[i], n, shapes[i]);
    grads_[i] = grads_flat_.flat(offsets_[i], n, shapes[i]);
  }
  ST_CHECK(attn.size() == 1 || static_cast<int>(attn.size()) == cfg_.n_layer, "GPT2: ",
           attn.size(), " attention configs for ", cfg_.n_layer, " layers");
  for (int l = 0; l < cfg_.n_layer; ++l) {
    attn_cfg_.push_back(attn[attn.size() == 1 ? 0 : l]);
    attn_.push_back(be_.make_attention(attn_cfg_.back()));
  }
  LossScalerConfig lsc = ls;
  lsc.enabled = compute_ == DType::F16;
  scaler_ = LossScaler(lsc);
}

void GPT2::init_weights(uint64_t seed) {
  Rng rng(seed);
  const auto shapes = param_shapes(cfg_);
  std::vector<float> flat(nparams_, 0.0f);
  const double std_proj = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
  const int64_t C = cfg_.n_embd;
  for (int i = 0; i < kNumParams; ++i) {
    float* p = flat.data() + offsets_[i];
    const int64_t n = shape_numel(shapes[i]);
    if (i == kLn1w || i == kLn2w || i == kLnfw) {
      for (int64_t j = 0; j < n; ++j) p[j] = 1.0f;
    } else if (is_decayed(i)) {
      // Padded vocabulary rows stay zero and draw nothing, so the stream is Vp-independent.
      const int64_t drawn = i == kWte ? static_cast<int64_t>(cfg_.vocab_size) * C : n;
      const double sd = (i == kAttprojw || i == kFcprojw) ? std_proj : 0.02;
      for (int64_t j = 0; j < drawn; ++j) p[j] = static_cast<float>(sd * rng.normal());
    }  // biases stay 0
  }
  set_master_fp32(flat);
  adam_t_ = 0;
}

void GPT2::set_master_fp32(const std::vector<float>& flat) {
  ST_CHECK(static_cast<int64_t>(flat.size()) == nparams_, "weights: got ", flat.size(),
           " values, the model has ", nparams_);
  Tensor host = Tensor::empty({nparams_}, DType::F32);
  std::copy(flat.begin(), flat.end(), host.data<float>());
  if (!sharded()) {
    be_.copy(master_, host);
    sync_params_from_master();
    return;
  }
  if (!separate_master_) {  // the master is the parameters
    be_.copy(params_flat_, host);
    return;
  }
  const int64_t ns = shard_end_ - shard_begin_;
  be_.copy(master_, host.flat(shard_begin_, ns, {ns}));
  be_.round_copy(params_flat_, host, compute_);  // = round(master) on the shard
}

std::vector<float> GPT2::master_fp32() const {
  Tensor src = master_;
  if (sharded()) {
    if (separate_master_) {
      ST_CHECK(master_source_, "the master weights are sharded across ranks (dist.zero 1): ",
               "this rank holds elements [", shard_begin_, ", ", shard_end_, ") only");
      std::vector<float> w = master_source_();
      ST_CHECK(static_cast<int64_t>(w.size()) == nparams_, "gathered master weights: ",
               w.size(), " values for ", nparams_, " parameters");
      return w;
    }
    src = params_flat_;
  }
  Tensor host = Tensor::empty({nparams_}, DType::F32);
  be_.copy(host, src);
  const float* p = host.data<float>();
  return std::vector<float>(p, p + nparams_);
}

Tensor GPT2::master_flat() const {
  if (sharded() && !separate_master_) {
    const int64_t ns = shard_end_ - shard_begin_;
    return params_flat_.flat(shard_begin_, ns, {ns});
  }
  return master_;
}

size_t GPT2::optimizer_bytes() const {
  return m_.nbytes() + v_.nbytes() + (separate_master_ ? master_.nbytes() : 0);
}

void GPT2::sync_params_from_master() {
  if (!separate_master_) return;  // master and parameters are one buffer
  if (!sharded()) {
    be_.round_copy(params_flat_, master_, compute_);
    return;
  }
  const int64_t ns = shard_end_ - shard_begin_;
  be_.round_copy(params_flat_.flat(shard_begin_, ns, {ns}), master_, compute_);
}

std::vector<double> GPT2::grad_sum_squares_chunks(int64_t begin, int64_t end) const {
  ST_CHECK(begin >= 0 && begin <= end && end <= nparams_ &&
               (begin == end || begin % kSumSquaresChunk == 0),
           "gradient chunk range [", begin, ", ", end, ") of ", nparams_);
  std::vector<double> part;
  for (int64_t i = begin; i < end; i += kSumSquaresChunk) {
    const int64_t n = std::min(kSumSquaresChunk, end - i);
    part.push_back(be_.sum_squares(grads_flat_.flat(i, n, {n})));
  }
  return part;
}

void GPT2::ensure_acts(int B, int T) {
  ST_CHECK(B > 0 && T > 0, "batch size and sequence length must be positive, got B=", B,
           " T=", T);
  ST_CHECK(T <= cfg_.max_seq_len, "sequence length ", T, " exceeds model.max_seq_len ",
           cfg_.max_seq_len);
  if (acts_.B == B && acts_.T == T) return;
  Acts a;
  a.B = B;
  a.T = T;
  const std::vector<ActivationSpec> specs = activation_specs(cfg_, B, T, recompute_);
  size_t next = 0;
  auto take = [&](const char* name) {  // the next tensor of the list, which must be `name`
    ST_CHECK(next < specs.size() && std::string(specs[next].name) == name,
             "activation_specs out of step with ensure_acts at ", name);
    const ActivationSpec& s = specs[next++];
    if (s.host) return Tensor::empty(s.shape, DType::I32);
    return be_.alloc(s.shape, s.stat ? stat_ : storage_);
  };
  a.tokens = take("tokens");
  a.targets = take("targets");
  a.encoded = take("encoded");
  a.ln1 = take("ln1");
  a.ln1_mean = take("ln1_mean");
  a.ln1_rstd = take("ln1_rstd");
  a.qkv = take("qkv");
  a.atty = take("atty");
  a.lse = take("lse");
  a.attproj = take("attproj");
  a.residual2 = take("residual2");
  a.ln2 = take("ln2");
  a.ln2_mean = take("ln2_mean");
  a.ln2_rstd = take("ln2_rstd");
  a.fch = take("fch");
  a.fch_gelu = take("fch_gelu");
  a.fcproj = take("fcproj");
  a.residual3 = take("residual3");
  a.lnf = take("lnf");
  a.lnf_mean = take("lnf_mean");
  a.lnf_rstd = take("lnf_rstd");
  a.logits = take("logits");
  a.losses = take("losses");
  a.dresidual = take("dresidual");
  a.dbtc = take("dbtc");
  a.dbt4c = take("dbt4c");
  a.dqkv = take("dqkv");
  a.datty = take("datty");
  ST_CHECK(next == specs.size(), "activation_specs lists ", specs.size(), " tensors, ensure_acts allocates ", next);
  acts_ = std::move(a);
}

std::vector<ActivationSpec> activation_specs(const GPT2Config& c, int B, int T, Recompute r) {
  const int64_t L = c.n_layer, C = c.n_embd, NH = c.n_head, Vp = c.vp();
  const int64_t Lln = r == Recompute::kGeluLayernorm ? 1 : L;  // ln1/ln2 buffers
  const int64_t Lgelu = r == Recompute::kNone ? L : 1;
  const int64_t b = B, t = T;
  return {{"tokens", {b, t}, false, true},
          {"targets", {b, t}, false, true},
          {"encoded", {b, t, C}},
          {"ln1", {Lln, b, t, C}},
          {"ln1_mean", {L, b, t}, true},
          {"ln1_rstd", {L, b, t}, true},
          {"qkv", {L, b, t, 3 * C}},
          {"atty", {L, b, t, C}},
          {"lse", {L, b, NH, t}, true},
          {"attproj", {L, b, t, C}},
          {"residual2", {L, b, t, C}},
          {"ln2", {Lln, b, t, C}},
          {"ln2_mean", {L, b, t}, true},
          {"ln2_rstd", {L, b, t}, true},
          {"fch", {L, b, t, 4 * C}},
          {"fch_gelu", {Lgelu, b, t, 4 * C}},
          {"fcproj", {L, b, t, C}},
          {"residual3", {L, b, t, C}},
          {"lnf", {b, t, C}},
          {"lnf_mean", {b, t}, true},
          {"lnf_rstd", {b, t}, true},
          {"logits", {b, t, Vp}},
          {"losses", {b, t}, true},
          {"dresidual", {b, t, C}},
          {"dbtc", {b, t, C}},
          {"dbt4c", {b, t, 4 * C}},
          {"dqkv", {b, t, 3 * C}},
          {"datty", {b, t, C}}};
}

ModelMemory model_memory(const GPT2Config& cfg, const Backend& be, DType compute, int B, int T,
                         Recompute r, bool separate_grad_scratch, int64_t shard_numel) {
  GPT2Config c = cfg;
  c.padded_vocab_size = c.vp();
  const DType storage = be.storage_dtype(compute);
  const DType stat = be.storage_dtype(compute == DType::F64 ? DType::F64 : DType::F32);
  const int64_t master = dtype_size(compute == DType::F64 ? DType::F64 : DType::F32);
  const int64_t n = num_parameters(c), ns = shard_numel < 0 ? n : shard_numel;
  const int64_t ps = dtype_size(storage);
  ModelMemory m;
  m.params = n * ps;
  m.grads = n * ps;
  m.master = compute == DType::BF16 || compute == DType::F16 ? ns * master : 0;
  m.adam_mv = 2 * ns * master;
  m.grad_scratch = separate_grad_scratch ? n * ps : 0;
  for (const ActivationSpec& s : activation_specs(c, B, T, r))
    m.activations += shape_numel(s.shape) *
                     static_cast<int64_t>(dtype_size(s.host ? DType::I32 : s.stat ? stat : storage));
  return m;
}

void GPT2::set_recompute(Recompute r) {
  if (r == recompute_) return;
  recompute_ = r;
  acts_ = Acts{};  // reallocated with the new layout at the next forward
  has_targets_ = false;
}

size_t GPT2::activation_bytes() const {
  const Acts& a = acts_;
  size_t n = 0;
  for (const Tensor* t :
       {&a.encoded, &a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.atty, &a.lse, &a.attproj,
        &a.residual2, &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.fch, &a.fch_gelu, &a.fcproj,
        &a.residual3, &a.lnf, &a.lnf_mean, &a.lnf_rstd, &a.logits, &a.losses, &a.dresidual,
        &a.dbtc, &a.dbt4c, &a.dqkv, &a.datty})
    if (t->defined()) n += t->nbytes();
  return n;
}

Tensor GPT2::residual_in(int l) const { return l == 0 ? acts_.encoded : acts_.residual3[l - 1]; }

float GPT2::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  forward_trunk(tokens, B, T);
  if (!targets) return std::numeric_limits<float>::quiet_NaN();
  Acts& a = acts_;
  std::copy(targets, targets + B * T, a.targets.data<int32_t>());
  be_.crossentropy_forward_backward(a.losses, Tensor(), a.logits, a.targets, cfg_.vocab_size,
                                    0.0f, compute_);
  has_targets_ = true;
  return fetch_mean_loss();
}

float GPT2::forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T,
                             int grad_accum_steps) {
  ST_CHECK(targets, "forward_backward needs targets");
  forward_trunk(tokens, B, T);
  Acts& a = acts_;
  std::copy(targets, targets + B * T, a.targets.data<int32_t>());
  // backward_pass's classifier writes the losses and dlogits in one pass over the logits:
  // the same losses forward() computes, without forward()'s loss-only pass.
  backward_pass(grad_accum_steps);
  return fetch_mean_loss();
}

float GPT2::fetch_mean_loss() {
  const Acts& a = acts_;
  const int n = a.B * a.T;
  Tensor host = Tensor::empty({a.B, a.T}, DType::F64);
  be_.copy(host, a.losses);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += host.data<double>()[i];
  mean_loss_ = sum / n;
  return static_cast<float>(mean_loss_);
}

void GPT2::forward_trunk(const int32_t* tokens, int B, int T) {
  has_targets_ = false;
  ensure_acts(B, T);
  const DType f = compute_;
  Acts& a = acts_;
  for (int i = 0; i < B * T; ++i)
    ST_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, "token id ", tokens[i],
             " at position ", i, " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
  std::copy(tokens, tokens + B * T, a.tokens.data<int32_t>());
  be_.encoder_forward(a.encoded, a.tokens, params_[kWte], params_[kWpe], f);
  // Every residual add feeds a layernorm (ln2 of its layer, ln1 of the next, or lnf): the
  // backend runs each pair as one call (fused on the GPU; the same two kernels on the CPU).
  be_.layernorm_forward(ln1(0), a.ln1_mean[0], a.ln1_rstd[0], residual_in(0), params_[kLn1w][0],
                        params_[kLn1b][0], f);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    be_.matmul_forward(a.qkv[l], ln1(l), params_[kQkvw][l], params_[kQkvb][l], f);
    attn_[l]->forward(a.atty[l], a.lse[l], a.qkv[l], cfg_.n_head, f);
    be_.matmul_forward(a.attproj[l], a.atty[l], params_[kAttprojw][l], params_[kAttprojb][l], f);
    be_.residual_layernorm_forward(a.residual2[l], ln2(l), a.ln2_mean[l], a.ln2_rstd[l],
                                   residual_in(l), a.attproj[l], params_[kLn2w][l],
                                   params_[kLn2b][l], f);
    be_.matmul_forward(a.fch[l], ln2(l), params_[kFcw][l], params_[kFcb][l], f);
    be_.gelu_forward(fch_gelu(l), a.fch[l], f);
    be_.matmul_forward(a.fcproj[l], fch_gelu(l), params_[kFcprojw][l], params_[kFcprojb][l], f);
    if (l + 1 < cfg_.n_layer) {
      be_.residual_layernorm_forward(a.residual3[l], ln1(l + 1), a.ln1_mean[l + 1],
                                     a.ln1_rstd[l + 1], a.residual2[l], a.fcproj[l],
                                     params_[kLn1w][l + 1], params_[kLn1b][l + 1], f);
    } else {
      be_.residual_layernorm_forward(a.residual3[l], a.lnf, a.lnf_mean, a.lnf_rstd, a.residual2[l],
                                     a.fcproj[l], params_[kLnfw], params_[kLnfb], f);
    }
  }
  be_.matmul_forward(a.logits, a.lnf, params_[kWte], Tensor(), f);
}

void GPT2::zero_grad() {
  be_.zero(grads_flat_);
  grads_zero_ = true;
}

void GPT2::backward(int grad_accum_steps) {
  ST_CHECK(has_targets_, "backward needs a forward with targets first");
  has_targets_ = false;
  backward_pass(grad_accum_steps);
}

void GPT2::backward_pass(int grad_accum_steps) {
  ST_CHECK(grad_accum_steps > 0, "grad_accum_steps must be positive");
  // kSeparate after the first micro-batch: this micro-batch's gradient goes to the scratch
  // buffer (from zero) and is added to the sum at the end.
  const bool separate = accum_mode_ == GradAccumMode::kSeparate && !grads_zero_;
  grads_zero_ = false;
  if (separate && !scratch_flat_.defined()) {
    scratch_flat_ = be_.alloc({nparams_}, storage_);
    const auto shapes = param_shapes(cfg_);
    for (int i = 0; i < kNumParams; ++i)
      scratch_[i] = scratch_flat_.flat(offsets_[i], shape_numel(shapes[i]), shapes[i]);
  }
  if (separate) be_.zero(scratch_flat_);
  const std::array<Tensor, kNumParams>& G = separate ? scratch_ : grads_;  // written here
  const DType f = compute_;
  Acts& a = acts_;
  const int B = a.B, T = a.T;
  const float dloss = scaler_.scale() / (static_cast<float>(B) * T * grad_accum_steps);
  // The classifier recomputes the softmax and overwrites the logits with dlogits.
  Tensor dlogits = a.logits;
  be_.crossentropy_forward_backward(a.losses, dlogits, a.logits, a.targets, cfg_.vocab_size,
                                    dloss, f);
  be_.matmul_backward(a.dbtc, G[kWte], Tensor(), dlogits, a.lnf, params_[kWte], f);
  be_.zero(a.dresidual);
  const int last = cfg_.n_layer - 1;
  // Each layernorm backward also makes the bias gradient of the projection whose output
  // gradient it leaves in a.dresidual (the column sums of a.dresidual): the last layer's fc
  // projection here, then attproj after ln2 and the previous layer's fcproj after ln1; those
  // matmul_backwards run without dbias (layernorm_backward_dbias; the CPU backend's two calls
  // have the same bits).
  be_.layernorm_backward_dbias(a.dresidual, G[kLnfw], G[kLnfb], G[kFcprojb][last], a.dbtc,
                               a.residual3[last], params_[kLnfw], a.lnf_mean, a.lnf_rstd, f);
  for (int l = last; l >= 0; --l) {
    // Recomputation: the same kernels on the same inputs rewrite the forward's bits (the
    // layernorm's mean and rstd are rewritten with identical values).
    if (recompute_ != Recompute::kNone) be_.gelu_forward(fch_gelu(l), a.fch[l], f);
    if (recompute_ == Recompute::kGeluLayernorm) {
      be_.layernorm_forward(ln2(l), a.ln2_mean[l], a.ln2_rstd[l], a.residual2[l],
                            params_[kLn2w][l], params_[kLn2b][l], f);
      be_.layernorm_forward(ln1(l), a.ln1_mean[l], a.ln1_rstd[l], residual_in(l),
                            params_[kLn1w][l], params_[kLn1b][l], f);
    }
    // a.dresidual holds d(residual3[l]) = d(fcproj[l]).
    be_.matmul_backward(a.dbt4c, G[kFcprojw][l], Tensor(), a.dresidual, fch_gelu(l),
                        params_[kFcprojw][l], f);
    // The fc bias gradient is the column sum of the GELU's input gradient: made in the pass
    // that writes it (gelu_backward_dbias; the CPU backend's two calls have the same bits).
    be_.gelu_backward_dbias(a.dbt4c, G[kFcb][l], a.fch[l], a.dbt4c, f);
    be_.matmul_backward(a.dbtc, G[kFcw][l], Tensor(), a.dbt4c, ln2(l), params_[kFcw][l], f);
    be_.layernorm_backward_dbias(a.dresidual, G[kLn2w][l], G[kLn2b][l], G[kAttprojb][l],
                                 a.dbtc, a.residual2[l], params_[kLn2w][l], a.ln2_mean[l],
                                 a.ln2_rstd[l], f);
    // a.dresidual now holds d(residual2[l]) = d(attproj[l]).
    be_.matmul_backward(a.datty, G[kAttprojw][l], Tensor(), a.dresidual, a.atty[l],
                        params_[kAttprojw][l], f);
    if (observer_) observer_(AttentionTaps{l, a.qkv[l], a.atty[l], a.datty, ln1(l)});
    attn_[l]->backward(a.dqkv, a.datty, a.qkv[l], a.atty[l], a.lse[l], cfg_.n_head, f);
    be_.matmul_backward(a.dbtc, G[kQkvw][l], G[kQkvb][l], a.dqkv, ln1(l),
                        params_[kQkvw][l], f);
    if (l > 0) {  // a.dresidual then holds d(residual3[l - 1]) = d(fcproj[l - 1])
      be_.layernorm_backward_dbias(a.dresidual, G[kLn1w][l], G[kLn1b][l], G[kFcprojb][l - 1],
                                   a.dbtc, residual_in(l), params_[kLn1w][l], a.ln1_mean[l],
                                   a.ln1_rstd[l], f);
    } else {
      be_.layernorm_backward(a.dresidual, G[kLn1w][l], G[kLn1b][l], a.dbtc, residual_in(l),
                             params_[kLn1w][l], a.ln1_mean[l], a.ln1_rstd[l], f);
    }
  }
  be_.encoder_backward(G[kWte], G[kWpe], a.dresidual, a.tokens, f);
  if (separate) be_.residual_forward(grads_flat_, grads_flat_, scratch_flat_, f);
}

void GPT2::set_collect_attention_stats(bool on) {
  for (auto& a : attn_) a->set_collect_stats(on);
}

StepStats GPT2::step(float lr, const OptimConfig& opt, std::optional<double> sum_squares) {
  ST_CHECK(sum_squares || !sharded(), "a sharded model's step needs the global gradient sum of "
           "squares");
  StepStats s;
  s.loss_scale = scaler_.scale();
  const double ss = sum_squares ? *sum_squares : grad_sum_squares();
  s.grad_norm = std::sqrt(ss) / scaler_.scale();
  s.skipped = scaler_.update(std::isfinite(ss));
  if (s.skipped) return s;
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1.
  double coef = 1.0;
  if (opt.grad_clip > 0) coef = std::min(1.0, opt.grad_clip / (s.grad_norm + 1e-6));
  ++adam_t_;
  AdamWArgs args;
  args.lr = lr;
  args.beta1 = opt.beta1;
  args.beta2 = opt.beta2;
  args.eps = opt.eps;
  args.step = adam_t_;
  args.grad_scale = static_cast<float>(coef / s.loss_scale);
  // Each tensor's part inside the shard (all of every tensor unless sharded). AdamW is
  // elementwise, so updating a tensor in pieces gives the bits of updating it whole.
  const Tensor master = master_flat();
  const auto shapes = param_shapes(cfg_);
  for (int i = 0; i < kNumParams; ++i) {
    const int64_t lo = std::max(offsets_[i], shard_begin_);
    const int64_t hi = std::min(offsets_[i] + shape_numel(shapes[i]), shard_end_);
    if (hi <= lo) continue;
    const int64_t n = hi - lo, at = lo - shard_begin_;
    args.weight_decay = is_decayed(i) ? opt.weight_decay : 0.0f;
    be_.adamw_update(master.flat(at, n, {n}), params_flat_.flat(lo, n, {n}),
                     grads_flat_.flat(lo, n, {n}), m_.flat(at, n, {n}), v_.flat(at, n, {n}),
                     args, compute_);
  }
  return s;
}

}  // namespace st
