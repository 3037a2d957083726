// The parsed views of a config: what the modules below the trainer take, built from the
// config's values (train/config.h). The per-layer attention specs (attention.layer_backends,
// attention.fp32_out_heads) are parsed here; validate_config calls attention_configs, so a
// bad spec is refused when the config is loaded.
#include "train/config.h"

#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace st {
namespace {

// The items of a list key ("2:flash, 5:baseline"), blanks removed.
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      out.push_back(cur);
      cur.clear();
    } else if (ch != ' ') {
      cur.push_back(ch);
    }
  }
  if (!cur.empty() || !out.empty()) out.push_back(cur);
  return out;
}

int parse_index(const std::string& s, int limit, const std::string& where, const char* what) {
  size_t used = 0;
  int v = -1;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < 0 || v >= limit)
    fail(where, ": '", s, "' is not a ", what, " index in [0, ", limit, ")");
  return v;
}

}  // namespace

std::vector<AttentionConfig> attention_configs(const Config& c, const std::string& where) {
  const AttentionSection& a = c.attention;
  AttentionConfig base;
  base.kind = parse_attention_kind(a.backend);
  base.rule = parse_rounding_rule(a.rule);
  const auto fmt = parse_point_format;
  base.qkv = fmt(a.qkv);
  base.scores = fmt(a.scores);
  base.probs = fmt(a.probs);
  base.accum = fmt(a.accum);
  base.out = fmt(a.out);
  base.mac = fmt(a.mac);
  base.grads = fmt(a.grads);
  base.lsum = fmt(a.lsum);
  base.lsum_mac = fmt(a.lsum_mac);
  base.delta = parse_delta_mode(a.delta);
  base.o_tilde_bits = a.o_tilde_bits;
  base.o_tilde_gain = a.o_tilde_gain;
  base.o_tilde_scope = parse_o_tilde_scope(a.o_tilde_scope);
  base.tie_break = a.tie_break;
  base.block_q = a.block_q;
  base.block_k = a.block_k;
  base.beta = a.beta;
  base.tie_tol = a.tie_tol;
  base.max_shift = a.max_shift;
  base.tie_shift = parse_tie_shift(a.tie_shift);
  base.cuda_kernel = parse_flash_kernel(a.cuda_kernel);
  std::vector<AttentionConfig> layers(c.model.n_layer, base);
  const std::string lb = where + "attention.layer_backends";
  for (const std::string& item : split(a.layer_backends, ',')) {
    const auto kv = split(item, ':');
    if (kv.size() != 2) fail(lb, ": '", item, "' is not LAYER:BACKEND (e.g. 2:flash)");
    const int l = parse_index(kv[0], c.model.n_layer, lb, "layer");
    try {
      layers[l].kind = parse_attention_kind(kv[1]);
    } catch (const Error& e) {
      fail(lb, ": ", e.what());
    }
  }
  const std::string fh = where + "attention.fp32_out_heads";
  for (const std::string& item : split(a.fp32_out_heads, ',')) {
    const auto lh = split(item, '.');
    if (lh.size() != 2) fail(fh, ": '", item, "' is not LAYER.HEAD (e.g. 2.8)");
    const int l = parse_index(lh[0], c.model.n_layer, fh, "layer");
    layers[l].fp32_out_heads.push_back(parse_index(lh[1], c.model.n_head, fh, "head"));
  }
  // cudnn is NVIDIA's GPU kernel: refused here when the config can never put it on a GPU.
  for (int l = 0; l < c.model.n_layer; ++l) {
    if (layers[l].kind != AttentionKind::Cudnn) continue;
    const std::string key = base.kind == AttentionKind::Cudnn
                                ? "attention.backend = cudnn"
                                : "attention.layer_backends puts cudnn on layer " + std::to_string(l) + ",";
    if (c.device == "cpu")
      fail(where, key, " but device is cpu: cuDNN's fused attention runs only on an NVIDIA GPU "
           "(set device: cuda, or use flash on the CPU; docs/numerics.md, \"cuDNN\", lists the "
           "settings nearest to it)");
    const DType compute = parse_dtype(c.precision.compute);
    if (compute != DType::BF16 && compute != DType::F16)
      fail(where, key, " but precision.compute is ", c.precision.compute,
           ": cuDNN's fused attention takes bf16 or fp16 (set precision.compute: bf16)");
    break;
  }
  // o_tilde_bits and o_tilde_gain need a flash layer (bits: O~ in an FP32-range format),
  // o_tilde_scope one of them, tie_break a flash layer: resolved now, so a wrong one stops before a run.
  if (a.o_tilde_bits || a.o_tilde_gain != 0 || base.o_tilde_scope != OTildeScope::All ||
      a.tie_break != 0) {
    const DType compute = parse_dtype(c.precision.compute);
    for (int l = 0; l < c.model.n_layer; ++l) {
      try {
        layers[l].numerics(compute, 0);
      } catch (const Error& e) {
        fail(where, "layer ", l, ": ", e.what());
      }
    }
  }
  return layers;
}

std::vector<AttentionConfig> attention_configs(const Config& c) {
  return attention_configs(c, (c.source.empty() ? std::string("<config>") : c.source) + ": ");
}

GPT2Config model_config(const Config& cfg) {
  GPT2Config mc;
  mc.n_layer = cfg.model.n_layer;
  mc.n_head = cfg.model.n_head;
  mc.n_embd = cfg.model.n_embd;
  mc.max_seq_len = cfg.model.max_seq_len;
  mc.vocab_size = cfg.model.vocab_size;
  return mc;
}

DataSpec data_spec(const Config& c) {
  DataSpec ds;
  ds.train_path = c.data.train_path;
  ds.val_path = c.data.val_path;
  ds.format = c.data.format;
  ds.tokenizer = c.data.tokenizer;
  ds.tokenizer_dir = c.data.tokenizer_dir;
  ds.prepare_from = c.data.prepare_from;
  ds.val_fraction = c.data.val_fraction;
  return ds;
}

LossScalerConfig loss_scaler_config(const Config& c) {
  LossScalerConfig ls;
  ls.init_scale = static_cast<float>(c.precision.loss_scale_init);
  ls.growth_interval = c.precision.loss_scale_growth_interval;
  return ls;
}

DType compute_format(const Config& c) { return parse_dtype(c.precision.compute); }

GradAccumMode grad_accum_mode(const Config& c) {
  return c.train.grad_accum_mode == "separate" ? GradAccumMode::kSeparate : GradAccumMode::kFused;
}

Recompute recompute_mode(const Config& c) { return parse_recompute(c.train.recompute); }

}  // namespace st
