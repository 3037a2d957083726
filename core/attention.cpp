#include "core/attention.h"

#include "core/error.h"

namespace st {

AttentionKind parse_attention_kind(const std::string& s) {
  if (s == "baseline") return AttentionKind::Baseline;
  if (s == "flash") return AttentionKind::Flash;
  if (s == "stabilized_flash") return AttentionKind::StabilizedFlash;
  fail("unknown attention backend '", s, "' (expected baseline, flash or stabilized_flash)");
}

const char* attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::Baseline: return "baseline";
    case AttentionKind::Flash: return "flash";
    case AttentionKind::StabilizedFlash: return "stabilized_flash";
  }
  return "?";
}

TieShift parse_tie_shift(const std::string& s) {
  if (s == "beta") return TieShift::Beta;
  if (s == "exact_sum") return TieShift::ExactSum;
  fail("unknown tie shift '", s, "' (expected beta or exact_sum)");
}

const char* tie_shift_name(TieShift t) { return t == TieShift::Beta ? "beta" : "exact_sum"; }

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
  return n;
}

}  // namespace st
