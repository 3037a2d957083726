// The parts of the attention numerics tests (test_attention.cpp, test_attention_spec.cpp,
// test_attention_stabilized.cpp, test_attention_class.cpp: one executable, label cpu) that
// several files use: vectors of doubles and their errors, the independent FP64 reference
// head (plain softmax attention and its analytic backward), one head through head_forward +
// head_backward, and the random heads the reference comparisons run on.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/head_cpu.h"
#include "attention_test_util.h"
#include "core/attention_numerics.h"
#include "core/rng.h"

namespace st::attn_ref {

using Vec = std::vector<double>;

inline Vec randn(size_t n, Rng& rng, double scale = 1.0) {
  Vec x(n);
  for (double& v : x) v = scale * rng.normal();
  return x;
}

inline Vec rounded(const Vec& x, DType f) {
  Vec r(x);
  for (double& v : r) v = round_fmt(v, f);
  return r;
}

// max|x|, and max |a - b| with NaN (or a size mismatch) as infinite error.
using attn_test::max_abs;
using attn_test::max_err;

// max|a - ref| / max|ref| (absolute where ref is all zero, e.g. dQ, dK at T = 1).
inline double rel_err(const Vec& a, const Vec& ref) {
  const double m = max_abs(ref);
  return max_err(a, ref) / (m > 0 ? m : 1.0);
}

// ---- The independent FP64 reference: plain softmax attention and its analytic backward.
struct RefHead {
  Vec o, lse, dq, dk, dv, delta;  // delta_t = rowsum(dO * O) = rowsum(dP * P), exact
};

inline RefHead reference_head(int T, int d, bool causal, const Vec& q, const Vec& k, const Vec& v,
                       const Vec& dout) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  RefHead r;
  r.o.assign(static_cast<size_t>(T) * d, 0.0);
  r.lse.assign(T, 0.0);
  r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(r.o.size(), 0.0);
  r.dv.assign(r.o.size(), 0.0);
  r.delta.assign(T, 0.0);
  Vec P(static_cast<size_t>(T) * T, 0.0), dS(P.size(), 0.0);
  for (int t = 0; t < T; ++t) {
    const int n = causal ? t + 1 : T;
    Vec s(n);
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += q[t * d + i] * k[j * d + i];
      s[j] = acc * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += std::exp(s[j] - mx);
    r.lse[t] = mx + std::log(sum);
    for (int j = 0; j < n; ++j) P[t * T + j] = std::exp(s[j] - mx) / sum;
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < d; ++i) r.o[t * d + i] += P[t * T + j] * v[j * d + i];
    if (dout.empty()) continue;
    // dP_tj = dO_t . v_j; dS = P * (dP - sum_j P dP).
    Vec dP(n);
    double D = 0;
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += dout[t * d + i] * v[j * d + i];
      dP[j] = acc;
      D += P[t * T + j] * acc;
    }
    r.delta[t] = D;
    for (int j = 0; j < n; ++j) dS[t * T + j] = P[t * T + j] * (dP[j] - D);
  }
  if (dout.empty()) return r;
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < T; ++j) {
      const double w = dS[t * T + j], p = P[t * T + j];
      if (w == 0 && p == 0) continue;
      for (int i = 0; i < d; ++i) {
        r.dq[t * d + i] += scale * w * k[j * d + i];
        r.dk[j * d + i] += scale * w * q[t * d + i];
        r.dv[j * d + i] += p * dout[t * d + i];
      }
    }
  return r;
}

// One head through head_forward in format f.
inline HeadForward forward_head(const AttentionConfig& cfg, DType f, int T, int d, const Vec& q,
                                const Vec& k, const Vec& v) {
  HeadForward fw;
  head_forward(cfg, cfg.numerics(f, 0), T, d, q.data(), k.data(), v.data(), fw);
  return fw;
}

// One head through head_forward + head_backward.
struct HeadRun {
  HeadForward fw;
  Vec dq, dk, dv;
};

inline HeadRun run_head(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                        const Vec& q, const Vec& k, const Vec& v, const Vec& dout) {
  HeadRun r;
  head_forward(cfg, n, T, d, q.data(), k.data(), v.data(), r.fw);
  if (!dout.empty()) {
    const size_t td = static_cast<size_t>(T) * d;
    r.dq.assign(td, std::nan(""));  // poisoned: unwritten elements fail the comparison
    r.dk.assign(td, std::nan(""));
    r.dv.assign(td, std::nan(""));
    head_backward(cfg, n, T, d, q.data(), k.data(), v.data(), r.fw, dout.data(), r.dq.data(),
                  r.dk.data(), r.dv.data());
  }
  return r;
}

inline AttentionConfig make_cfg(AttentionKind kind, RoundingRule rule, int br = 16, int bc = 32) {
  AttentionConfig c;
  c.kind = kind;
  c.rule = rule;
  c.block_q = br;
  c.block_k = bc;
  return c;
}

inline constexpr AttentionKind kKinds[] = {AttentionKind::Baseline, AttentionKind::Flash,
                                AttentionKind::StabilizedFlash};

// Errors of one run against the reference: O, dQ, dK, dV.
struct Errs {
  double o = 0, dq = 0, dk = 0, dv = 0;
  void max_with(const HeadRun& r, const RefHead& ref) {
    o = std::max(o, max_err(r.fw.o, ref.o));
    dq = std::max(dq, max_err(r.dq, ref.dq));
    dk = std::max(dk, max_err(r.dk, ref.dk));
    dv = std::max(dv, max_err(r.dv, ref.dv));
  }
};

// Random heads for the reference comparisons: inputs already in format f so the reference
// sees exactly what the kernels see.
struct HeadInputs {
  Vec q, k, v, dout;
  RefHead ref;
};

inline std::vector<HeadInputs> make_heads(int count, int T, int d, DType f, uint64_t seed,
                                   bool causal = true) {
  Rng rng(seed);
  std::vector<HeadInputs> hs(count);
  const size_t td = static_cast<size_t>(T) * d;
  for (auto& h : hs) {
    // q scaled up so the softmax rows are peaked (scores ~ N(0, 2^2)), as trained heads are.
    h.q = rounded(randn(td, rng, 2.0), f);
    h.k = rounded(randn(td, rng), f);
    h.v = rounded(randn(td, rng), f);
    h.dout = rounded(randn(td, rng), f);
    h.ref = reference_head(T, d, causal, h.q, h.k, h.v, h.dout);
  }
  return hs;
}

// The tiles and sizes of the reference comparisons.
struct TileCase {
  int br, bc;
  const char* what;
};
// T = 77 is no multiple of any tile; Br < Bc leaves key columns of a tile masked for a whole
// query tile; Br > Bc gives key tiles fully masked for the first rows of a query tile (the
// backward skips them); 0 is one tile per row; 1 x 5 is many rescaling steps.
inline constexpr TileCase kTiles[] = {
    {16, 32, "16x32"}, {32, 16, "32x16"}, {0, 0, "one tile"}, {1, 5, "1x5"}};
inline constexpr int kT = 77;
inline constexpr int kHeads = 3;  // independent random heads per setting (max error over them)

}  // namespace st::attn_ref
