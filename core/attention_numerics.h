// Where attention rounds. Every named quantity has a format; every arithmetic result that
// produces it is rounded to that format (round-to-nearest-even, correctly rounded from the
// exact FP64 value); sums inside matmuls and row reductions keep partial sums in `mac`.
//
// Rules (RESEARCH.md section 4), for the low format f (the model's compute format):
//   gpu       what CUDA kernels do. Matmuls accumulate in FP32. Baseline materialises S and P
//             in f; flash keeps S, the running max m, the sum l and the output accumulator O~
//             in FP32 and rounds only P~ (fed to P~V) and the final O.
//   every_op  every op's result rounded to f, flash's O~ and l after each key tile too;
//             matmuls still accumulate in FP32 inside.
//   every_mac every_op, and every multiply-add inside the matmuls rounded to f as well.
// Individual formats can be overridden after the rule is applied (e.g. accum: bf16 is the
// paper's implementation, whose O~ accumulator is a BF16 tensor).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace st {

enum class RoundingRule { Gpu, EveryOp, EveryMac };
RoundingRule parse_rounding_rule(const std::string& s);  // gpu | every_op | every_mac
const char* rounding_rule_name(RoundingRule r);

// How the backward's delta = rowsum(dO * O) is formed (flash backends; baseline never uses O).
enum class DeltaMode {
  O,              // from the stored O (format `out`)
  OSplit,         // O kept as the stored O plus a residual round_f(O32 - O) (one more f tensor)
  OFp32,          // from the forward's O in FP32, before the final rounding
  DpP,            // rowsum(dP * P), no O at all
  Fp32Recompute,  // O recomputed in FP32 from Q, K, V in the backward
};
DeltaMode parse_delta_mode(const std::string& s);  // o | o_split | o_fp32 | dp_p | fp32_recompute
const char* delta_mode_name(DeltaMode d);

// Where flash's o_tilde_bits rounding acts (issue 42: a tie-confined amplifier and its
// control). A key tile is tied when more than one of its scores lies within tie_tol of the
// tile's maximum: the test stabilized flash uses before shifting, evaluated on the same
// scores for flash and stabilized flash alike.
enum class OTildeScope {
  All,            // every key tile's O~ update
  Tied,           // only the O~ updates of tied tiles (where Qiu & Yao's bias arises)
  UntiedMatched,  // per head and forward call, as many untied tiles as there are tied ones,
                  // chosen by a hash of (tile, its maximum): the control for Tied
};
OTildeScope parse_o_tilde_scope(const std::string& s);  // all | tied | untied_matched
const char* o_tilde_scope_name(OTildeScope s);

// A rounding point's override: "auto" (nullopt: the rule's format) or a format parse_dtype
// reads (bf16, fp16, fp32, fp64).
std::optional<DType> parse_point_format(const std::string& s);

// Resolved formats of every rounding point.
struct AttnNumerics {
  DType low = DType::F32;     // the rule's low format f (o_split splits O in it)
  DType qkv = DType::F32;     // Q, K, V as read
  DType scores = DType::F32;  // S = scale * q.k (and S - m)
  DType probs = DType::F32;   // P (baseline) / P~ = exp(S - m) fed to P~V (flash)
  DType accum = DType::F32;   // flash: O~ and the rescale factor alpha; baseline: exp(S - m)
  DType lsum = DType::F32;    // the softmax row sum l (flash: running; baseline: sum of exp)
  DType out = DType::F32;     // stored O
  DType mac = DType::F32;     // partial sums inside matmuls (q.k, P V, the backward's)
  DType lsum_mac = DType::F32;  // partial sums of the softmax row sum l over one key tile
  DType grads = DType::F32;   // stored dQ, dK, dV, dS, dP
  bool round_ops = false;     // every_op/every_mac: intermediate results (a*b, a+b) rounded too
  // Flash only: O~ (the output accumulator, the rounding point of Qiu & Yao's bias) kept
  // with this many fraction bits and FP32's exponent range (BF16 keeps 7) instead of in
  // `accum`; 0: in `accum`. A narrower O~ amplifies the cause without changing the
  // mechanism (docs/numerics.md). Every rounding into O~ uses it: r(alpha * O~), r(P~ V)
  // and their sum; alpha itself stays in `accum`.
  int o_tilde_bits = 0;
  // Flash only, the other amplifier: the O~ update's rounding error multiplied by this
  // gain, O~ = u + gain * (r - u) held in the wide format, u = alpha * O~ + P~V exact and r
  // the update rounded to `accum` as usual (Qiu & Yao's bias, which arises there, scaled;
  // the rounding itself unchanged). 0: off; 1 gives r. Not with o_tilde_bits.
  double o_tilde_gain = 0;
  OTildeScope o_tilde_scope = OTildeScope::All;  // which O~ updates the amplifier acts on
  // Flash only, the counterfactual "ties broken": in a tied key tile, the j-th score within
  // tie_tol of the maximum (j = 0, 1, ... in key order) enters exp(S - m) lowered by
  // j * tie_break (in the wide format; S itself, the tie test and the statistics keep the
  // unperturbed scores). 0: off.
  double tie_break = 0;
  DeltaMode delta = DeltaMode::O;
  std::string describe() const;  // "qkv=bf16 scores=fp32 ... delta=o"
};

// Defaults for a backend under a rule, with f the low format. flash_like selects flash's
// formats for S, l and O~ (baseline has no accumulator).
AttnNumerics numerics_for_rule(RoundingRule rule, DType f, bool flash_like);

// The bits of finite x rounded to odd at FP32: truncated toward zero (one ULP down in
// magnitude if the conversion rounded away; beyond FLT_MAX this gives FLT_MAX), then the
// last bit set if inexact. Rounding these bits once more to a format with at least two
// fewer fraction bits is one correct rounding of x (no double rounding).
inline uint32_t round_odd_f32_bits(double x) {
  const float t = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &t, 4);
  if (std::fabs(static_cast<double>(t)) > std::fabs(x)) --u;
  float tz;
  std::memcpy(&tz, &u, 4);
  if (static_cast<double>(tz) != x) u |= 1u;
  return u;
}

// x rounded to format f, correctly (one rounding from the exact value): FP32 by the
// hardware conversion; BF16/FP16 via round-to-odd to FP32 then RNE.
// Inline: the attention kernels call it per element.
[[noreturn]] void round_fmt_bad_format(DType f);
inline double round_fmt(double x, DType f) {
  switch (f) {
    case DType::F64: return x;
    case DType::F32: return static_cast<double>(static_cast<float>(x));
    case DType::BF16:
    case DType::F16: {
      if (!std::isfinite(x)) return static_cast<double>(static_cast<float>(x));
      float tz;
      const uint32_t u = round_odd_f32_bits(x);
      std::memcpy(&tz, &u, 4);
      return f == DType::BF16 ? round_bf16(tz) : round_fp16(tz);
    }
    default: round_fmt_bad_format(f);
  }
}

// x rounded to nearest (ties to even) in the binary format with FP32's exponent range
// (gradual underflow included) and `bits` fraction bits, 1 <= bits <= 21: BF16 is bits = 7.
// One correct rounding from x: round to odd at FP32 first (23 fraction bits, at least two
// more than the target), then to nearest even at bit 23 - bits.
// Overflow gives Inf; NaN and Inf pass through.
[[noreturn]] void round_fraction_bits_bad(int bits);
inline double round_fraction_bits(double x, int bits) {
  if (bits < 1 || bits > 21) round_fraction_bits_bad(bits);
  if (!std::isfinite(x)) return x;
  const uint32_t u = round_odd_f32_bits(x);
  const int drop = 23 - bits;
  const uint32_t mag = u & 0x7fffffffu;
  // Adding half a unit minus one plus the kept LSB carries exactly when the dropped part is
  // above the midpoint, or at it with an odd kept part (as float_to_bf16_bits); a carry out
  // of the largest finite value lands on Inf's encoding.
  uint32_t r = mag + ((1u << (drop - 1)) - 1u) + ((mag >> drop) & 1u);
  r &= ~((1u << drop) - 1u);
  r |= u & 0x80000000u;
  float f;
  std::memcpy(&f, &r, 4);
  return static_cast<double>(f);
}

}  // namespace st
