// One attention interface for every backend method (baseline here; flash and stabilized
// flash plug in behind the same calls). q, k, v arrive packed as GPT-2's c_attn output.
//   qkv  (B, T, 3C): q = [..., 0:C], k = [..., C:2C], v = [..., 2C:3C]; head h uses
//        columns [h*HS, (h+1)*HS) of each third, HS = C / NH.
//   out  (B, T, C) heads concatenated; lse (B, NH, T) natural-log row log-sum-exp of the
//        scaled, masked scores (kept in FP32, or FP64 in the FP64 reference mode).
// An Attention object belongs to one layer and may keep what its backward needs.
#pragma once
#include <memory>
#include <string>

#include "core/tensor.h"

namespace st {

enum class AttentionKind { Baseline, Flash, StabilizedFlash };
AttentionKind parse_attention_kind(const std::string& s);  // baseline | flash | stabilized_flash
const char* attention_kind_name(AttentionKind k);

struct AttentionConfig {
  AttentionKind kind = AttentionKind::Baseline;
  // Format of the materialised scores S and probabilities P (baseline). Defaults follow
  // the compute format, as a PyTorch/cuBLAS baseline in BF16 stores them.
  bool causal = true;
};

class Attention {
 public:
  virtual ~Attention() = default;
  virtual std::string name() const = 0;
  // fmt: the compute format; every stored result is rounded to it.
  virtual void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head,
                       DType fmt) = 0;
  // dqkv is overwritten. out and lse are the forward's results for the same qkv.
  virtual void backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, int n_head, DType fmt) = 0;
};

}  // namespace st
