#include "core/attention.h"

#include <cmath>

#include "core/error.h"

namespace st {

AttentionKind parse_attention_kind(const std::string& s) {
  if (s == "baseline") return AttentionKind::Baseline;
  if (s == "flash") return AttentionKind::Flash;
  if (s == "stabilized_flash") return AttentionKind::StabilizedFlash;
  if (s == "cudnn") return AttentionKind::Cudnn;
  fail("unknown attention backend '", s,
       "' (expected baseline, flash, stabilized_flash or cudnn)");
}

const char* attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::Baseline: return "baseline";
    case AttentionKind::Flash: return "flash";
    case AttentionKind::StabilizedFlash: return "stabilized_flash";
    case AttentionKind::Cudnn: return "cudnn";
  }
  return "?";
}

TieShift parse_tie_shift(const std::string& s) {
  if (s == "beta") return TieShift::Beta;
  if (s == "exact_sum") return TieShift::ExactSum;
  fail("unknown tie shift '", s, "' (expected beta or exact_sum)");
}

const char* tie_shift_name(TieShift t) { return t == TieShift::Beta ? "beta" : "exact_sum"; }

FlashKernel parse_flash_kernel(const std::string& s) {
  if (s == "mma_sync") return FlashKernel::MmaSync;
  if (s == "sm90") return FlashKernel::Sm90;
  fail("unknown flash kernel '", s, "' (expected mma_sync or sm90)");
}

const char* flash_kernel_name(FlashKernel k) { return k == FlashKernel::Sm90 ? "sm90" : "mma_sync"; }

AttnNumerics AttentionConfig::numerics(DType compute, int head) const {
  AttnNumerics n = numerics_for_rule(rule, compute, kind != AttentionKind::Baseline);
  if (qkv) n.qkv = *qkv;
  if (scores) n.scores = *scores;
  if (probs) n.probs = *probs;
  if (accum) n.accum = *accum;
  if (out) n.out = *out;
  if (mac) n.mac = *mac;
  if (grads) n.grads = *grads;
  n.lsum = lsum ? *lsum : n.accum;
  n.lsum_mac = lsum_mac ? *lsum_mac : n.mac;
  for (int h : fp32_out_heads)
    if (h == head) n.out = compute == DType::F64 ? DType::F64 : DType::F32;
  n.delta = kind == AttentionKind::Baseline ? DeltaMode::DpP : delta;
  if (o_tilde_bits) {
    if (kind == AttentionKind::Baseline)
      fail("attention.o_tilde_bits = ", o_tilde_bits,
           " is set, but the baseline backend has no O~ accumulator (set it on flash or "
           "stabilized_flash runs only)");
    if (n.accum != DType::BF16 && n.accum != DType::F32)
      fail("attention.o_tilde_bits = ", o_tilde_bits, " narrows O~ within FP32's exponent "
           "range, but O~ is ", dtype_name(n.accum), " here (set attention.accum: bf16 or fp32)");
    // Below the format's own fraction bits (BF16 7, FP32 23), and at most 21 (the rounding
    // goes through FP32 with two bits to spare).
    const int most = n.accum == DType::BF16 ? 6 : 21;
    if (o_tilde_bits < 1 || o_tilde_bits > most)
      fail("attention.o_tilde_bits = ", o_tilde_bits, " must be in 1..", most, " to narrow O~ (",
           dtype_name(n.accum), " keeps ", n.accum == DType::BF16 ? 7 : 23,
           " fraction bits); 0 keeps O~ in attention.accum");
    n.o_tilde_bits = o_tilde_bits;
  }
  if (o_tilde_gain != 0) {
    if (kind == AttentionKind::Baseline)
      fail("attention.o_tilde_gain = ", o_tilde_gain,
           " is set, but the baseline backend has no O~ accumulator (set it on flash or "
           "stabilized_flash runs only)");
    if (o_tilde_bits)
      fail("attention.o_tilde_gain = ", o_tilde_gain, " and attention.o_tilde_bits = ",
           o_tilde_bits, " are two amplifiers of O~'s rounding; set one of them");
    if (!(o_tilde_gain >= 1) || !std::isfinite(o_tilde_gain))
      fail("attention.o_tilde_gain = ", o_tilde_gain, " must be a finite value >= 1 (1: "
           "O~ rounded as usual; 0: off)");
    if (n.accum != DType::BF16 && n.accum != DType::F16 && n.accum != DType::F32)
      fail("attention.o_tilde_gain = ", o_tilde_gain, " keeps O~ in FP32, but O~'s format "
           "is ", dtype_name(n.accum), " here (set attention.accum: bf16, fp16 or fp32)");
    n.o_tilde_gain = o_tilde_gain;
  }
  if (o_tilde_scope != OTildeScope::All) {
    if (!o_tilde_bits && !o_tilde_gain)
      fail("attention.o_tilde_scope = ", o_tilde_scope_name(o_tilde_scope),
           " says where O~'s rounding is amplified, but attention.o_tilde_bits and "
           "o_tilde_gain are 0 (set one, e.g. o_tilde_bits: 2, or leave o_tilde_scope at all)");
    n.o_tilde_scope = o_tilde_scope;
  }
  if (tie_break != 0) {
    if (kind != AttentionKind::Flash)
      fail("attention.tie_break = ", tie_break, " is set, but the backend is ",
           attention_kind_name(kind), ": breaking ties is flash's counterfactual (stabilized "
           "flash shifts tied maxima its own way; baseline has no tiles); set it on flash only");
    if (!(tie_break > 0) || !std::isfinite(tie_break))
      fail("attention.tie_break = ", tie_break, " must be a finite value > 0 (0: off)");
    n.tie_break = tie_break;
  }
  return n;
}

}  // namespace st
