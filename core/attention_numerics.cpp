#include "core/attention_numerics.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace st {

RoundingRule parse_rounding_rule(const std::string& s) {
  if (s == "gpu") return RoundingRule::Gpu;
  if (s == "every_op") return RoundingRule::EveryOp;
  if (s == "every_mac") return RoundingRule::EveryMac;
  fail("unknown attention rounding rule '", s, "' (expected gpu, every_op or every_mac)");
}

const char* rounding_rule_name(RoundingRule r) {
  switch (r) {
    case RoundingRule::Gpu: return "gpu";
    case RoundingRule::EveryOp: return "every_op";
    case RoundingRule::EveryMac: return "every_mac";
  }
  return "?";
}

DeltaMode parse_delta_mode(const std::string& s) {
  if (s == "o") return DeltaMode::O;
  if (s == "o_split") return DeltaMode::OSplit;
  if (s == "o_fp32") return DeltaMode::OFp32;
  if (s == "dp_p") return DeltaMode::DpP;
  if (s == "fp32_recompute") return DeltaMode::Fp32Recompute;
  fail("unknown delta mode '", s, "' (expected o, o_split, o_fp32, dp_p or fp32_recompute)");
}

const char* delta_mode_name(DeltaMode d) {
  switch (d) {
    case DeltaMode::O: return "o";
    case DeltaMode::OSplit: return "o_split";
    case DeltaMode::OFp32: return "o_fp32";
    case DeltaMode::DpP: return "dp_p";
    case DeltaMode::Fp32Recompute: return "fp32_recompute";
  }
  return "?";
}

OTildeScope parse_o_tilde_scope(const std::string& s) {
  if (s == "all") return OTildeScope::All;
  if (s == "tied") return OTildeScope::Tied;
  if (s == "untied_matched") return OTildeScope::UntiedMatched;
  fail("unknown O~ scope '", s, "' (expected all, tied or untied_matched)");
}

const char* o_tilde_scope_name(OTildeScope s) {
  switch (s) {
    case OTildeScope::All: return "all";
    case OTildeScope::Tied: return "tied";
    case OTildeScope::UntiedMatched: return "untied_matched";
  }
  return "?";
}

std::optional<DType> parse_point_format(const std::string& s) {
  if (s == "auto") return std::nullopt;
  return parse_dtype(s);
}

void round_fraction_bits_bad(int bits) {
  fail("round_fraction_bits: ", bits, " fraction bits is outside 1..21");
}

std::string AttnNumerics::describe() const {
  std::ostringstream os;
  os << "qkv=" << dtype_name(qkv) << " scores=" << dtype_name(scores)
     << " probs=" << dtype_name(probs) << " accum=" << dtype_name(accum)
     << " lsum=" << dtype_name(lsum) << " out=" << dtype_name(out) << " mac=" << dtype_name(mac)
     << " lsum_mac=" << dtype_name(lsum_mac)
     << " grads=" << dtype_name(grads) << (round_ops ? " round_ops" : "")
     << " delta=" << delta_mode_name(delta);
  if (o_tilde_bits) os << " o_tilde_bits=" << o_tilde_bits;
  if (o_tilde_gain) os << " o_tilde_gain=" << o_tilde_gain;
  if (o_tilde_scope != OTildeScope::All) os << " o_tilde_scope=" << o_tilde_scope_name(o_tilde_scope);
  if (tie_break > 0) os << " tie_break=" << tie_break;
  return os.str();
}

AttnNumerics numerics_for_rule(RoundingRule rule, DType f, bool flash_like) {
  AttnNumerics n;
  const DType wide = f == DType::F64 ? DType::F64 : DType::F32;  // the accumulator format
  n.low = n.qkv = n.probs = n.out = n.grads = f;
  n.mac = wide;
  if (rule == RoundingRule::Gpu) {
    n.scores = flash_like ? wide : f;  // flash keeps S in registers; baseline stores it
    n.accum = wide;
  } else {
    n.scores = n.accum = f;
    n.round_ops = true;
    if (rule == RoundingRule::EveryMac) n.mac = f;
  }
  n.lsum = n.accum;
  n.lsum_mac = n.mac;
  return n;
}

void round_fmt_bad_format(DType f) {
  fail("round_fmt: ", dtype_name(f), " is not a floating-point format");
}

}  // namespace st
