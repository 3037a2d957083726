// CPU implementations of the attention interface.
#pragma once
#include <memory>

#include "core/attention.h"

namespace st {

std::unique_ptr<Attention> make_attention_cpu(const AttentionConfig& cfg);
// Shape/dtype checks shared by the CPU attention methods.
void check_attention_args(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head);

}  // namespace st
