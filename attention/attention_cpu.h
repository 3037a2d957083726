// CPU implementations of the attention interface.
#pragma once
#include <memory>

#include "core/attention.h"

namespace st {

// Which implementation runs the heads: Auto takes the fast path (attention/head_fast.h)
// wherever it reproduces the lab, Lab always runs the numerics lab (the reference; tests
// compare the two).
enum class AttentionCpuPath { Auto, Lab };
std::unique_ptr<Attention> make_attention_cpu(const AttentionConfig& cfg,
                                              AttentionCpuPath path = AttentionCpuPath::Auto);
// Shape/dtype checks shared by the CPU attention methods.
void check_attention_args(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head);

}  // namespace st
