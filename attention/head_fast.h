// The attention fast path: one head of baseline, flash or stabilized flash in FP32 storage
// and FP32 arithmetic, for the numerics whose matmul partial sums are FP32 and that round
// no intermediate (every `gpu`-rule configuration, BF16/FP16/FP32 formats, with the
// overrides listed in head_fast_eligible). It runs the numerics lab's algorithm
// (attention/head_cpu.cpp, the reference) step for step: every matmul partial sum is the
// same FP32 FMA chain in the same order, every other operation the same FP64 expression
// rounded to the same format, so the results are the lab's bit for bit (tests/
// test_attention_fast.cpp checks it on every backend and format, each single-point override
// and delta mode it accepts, several tile shapes and tied maxima). What it gains: FP32
// vectors instead of FP64 values converted at every multiply-add.
#pragma once
#include "core/attention.h"

namespace st {

// True when head_fast_* reproduce the lab for these settings: no every_op/every_mac
// rounding of intermediates, mac and lsum_mac FP32, every other point BF16, FP16 or FP32,
// delta o, o_fp32 or o_split, tie_shift beta. Statistics collection is the caller's
// business (the lab collects them).
bool head_fast_eligible(const AttentionConfig& cfg, const AttnNumerics& n);

// A layer of n_head heads computing in `compute`: whether every head is eligible, and
// whether any head's backward reads O before its final rounding (flash with delta o_fp32
// or o_split), which the caller must then keep (HeadFastSaved::o32).
struct HeadFastLayer {
  bool eligible = false;
  bool keeps_o32 = false;
};
HeadFastLayer head_fast_layer(const AttentionConfig& cfg, DType compute, int n_head);

// What the backward needs from the forward, in caller-owned storage.
struct HeadFastSaved {
  float* o = nullptr;    // (T, d) the stored O, in format n.out
  float* o32 = nullptr;  // (T, d) O before its final rounding (FP32); only delta o_fp32/o_split
  float* lse = nullptr;  // (T) natural log-sum-exp of the scaled scores, FP32
  float* P = nullptr;    // (T, T) baseline's materialised probabilities, in format n.probs
};

// q, k, v: (T, d) row-major, already rounded to n.qkv. Fills sv (P only for baseline).
void head_fast_forward(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                       const float* q, const float* k, const float* v, const HeadFastSaved& sv);
// dout: (T, d) already rounded to n.grads. Writes dq, dk, dv (T, d) in format n.grads.
void head_fast_backward(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                        const float* q, const float* k, const float* v, const HeadFastSaved& sv,
                        const float* dout, float* dq, float* dk, float* dv);

// x rounded to format f (BF16, FP16 or FP32), as a float.
float round_to_float(double x, DType f);

}  // namespace st
