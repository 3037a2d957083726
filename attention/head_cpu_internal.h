// Internal to the numerics lab (attention/head_cpu.cpp, the forward, and
// head_cpu_backward.cpp): a head call's context (shapes, tiles, scale, rounding helpers) and
// the multiply-accumulate loops in format `mac` both directions use. Not part of the public
// header attention/head_cpu.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/head_cpu.h"
#include "core/error.h"

namespace st::head_lab {

inline DType wide_of(const AttnNumerics& n) { return n.low == DType::F64 ? DType::F64 : DType::F32; }

// Partial sums in format mac. The format test sits outside the loops so the FP32 and FP64
// paths vectorise (axpy) or run a plain FMA chain (dot).
inline void mac_sum(double& s, double a, DType mac) {
  s = mac == DType::F64 ? s + a : round_fmt(s + a, mac);
}

inline double dot(const double* a, const double* b, int n, DType mac) {
  if (mac == DType::F32) {
    float s = 0;
    for (int i = 0; i < n; ++i) s = std::fma(static_cast<float>(a[i]), static_cast<float>(b[i]), s);
    return s;
  }
  double s = 0;
  if (mac == DType::F64) {
    for (int i = 0; i < n; ++i) s += a[i] * b[i];
  } else {
    for (int i = 0; i < n; ++i) s = round_fmt(s + a[i] * b[i], mac);  // product exact in FP64
  }
  return s;
}

// acc[j] += w * x[j] for j < n, each acc[j] its own running sum in format mac.
inline void axpy(double* acc, double w, const double* x, int n, DType mac) {
  if (mac == DType::F32) {
    const float wf = static_cast<float>(w);
    for (int j = 0; j < n; ++j)
      acc[j] = std::fma(wf, static_cast<float>(x[j]), static_cast<float>(acc[j]));
  } else if (mac == DType::F64) {
    for (int j = 0; j < n; ++j) acc[j] += w * x[j];
  } else {
    for (int j = 0; j < n; ++j) acc[j] = round_fmt(acc[j] + w * x[j], mac);
  }
}

// out[s - c0] = a . b_s for s in [c0, c1), with b given transposed (bt: d x T). Each
// output runs the same sequential sum over j as dot(a, b_s), so results are identical to
// it; the loop over s vectorises.
inline void row_dots(const double* a, const double* bt, int T, int c0, int c1, int d, DType mac,
              double* out) {
  std::fill(out, out + (c1 - c0), 0.0);
  for (int j = 0; j < d; ++j) axpy(out, a[j], bt + static_cast<size_t>(j) * T + c0, c1 - c0, mac);
}

inline std::vector<double> transpose(const std::vector<double>& x, int T, int d) {
  std::vector<double> t(x.size());
  for (int r = 0; r < T; ++r)
    for (int j = 0; j < d; ++j) t[static_cast<size_t>(j) * T + r] = x[static_cast<size_t>(r) * d + j];
  return t;
}

struct Ctx {
  const AttentionConfig& cfg;
  const AttnNumerics& n;
  int T;   // query rows
  int Tk;  // keys (= T except through the dot-product entry points)
  int d;
  double scale;
  int bc;  // key tile width
  int br;  // query tile height
  bool flash;
  const double* dots;  // (T, Tk) given q.k values, or null: computed from q and K
  double rop(double x, DType f) const { return n.round_ops ? round_fmt(x, f) : x; }
  // Rounding into O~'s format: accum, or o_tilde_bits fraction bits when set and this key
  // tile is in o_tilde_scope (narrow).
  double r_ot(double x, bool narrow = true) const {
    return narrow && n.o_tilde_bits ? round_fraction_bits(x, n.o_tilde_bits)
                                    : round_fmt(x, n.accum);
  }
  int last_key(int t) const { return cfg.causal ? t : Tk - 1; }
  // S[s] for keys [c0, c1) of query row t (q: that row); kt is K transposed (d x Tk).
  void score_row(int t, const double* q, const double* kt, int c0, int c1, double* S) const {
    if (dots)
      std::copy(dots + static_cast<size_t>(t) * Tk + c0, dots + static_cast<size_t>(t) * Tk + c1,
                S + c0);
    else
      row_dots(q, kt, Tk, c0, c1, d, n.mac, S + c0);
    for (int s = c0; s < c1; ++s) S[s] = round_fmt(rop(S[s], n.scores) * scale, n.scores);
  }
};

inline Ctx make_ctx(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d, int Tk = -1,
             const double* dots = nullptr) {
  if (Tk < 0) Tk = T;
  ST_CHECK(T > 0 && Tk > 0 && d > 0, "attention head: T = ", T, ", keys = ", Tk, ", d = ", d);
  ST_CHECK(cfg.kind != AttentionKind::Cudnn, "attention head: the CPU lab cannot run "
           "attention.backend cudnn (NVIDIA's kernel; docs/numerics.md, \"cuDNN\")");
  ST_CHECK(!cfg.causal || Tk == T, "attention head: causal attention needs as many keys as "
           "query rows (got ", T, " rows, ", Tk, " keys)");
  const bool flash = cfg.kind != AttentionKind::Baseline;
  const int bc = flash && cfg.block_k > 0 ? cfg.block_k : Tk;
  const int br = flash && cfg.block_q > 0 ? cfg.block_q : T;
  // The scale as the kernel holds it: 1/sqrt(d) in the wide format.
  const double scale = round_fmt(1.0 / std::sqrt(static_cast<double>(d)), wide_of(n));
  return Ctx{cfg, n, T, Tk, d, scale, bc, br, flash, dots};
}

inline std::vector<double> rounded(const double* x, size_t count, DType f) {
  std::vector<double> r(x, x + count);
  for (double& v : r) v = round_fmt(v, f);
  return r;
}

}  // namespace st::head_lab
