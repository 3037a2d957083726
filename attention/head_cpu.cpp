// The numerics lab: one head of baseline, flash (FlashAttention-2) and stabilized flash
// attention with every rounding point explicit (formats in core/attention_numerics.h).
//
// Flash forward, row t, key tiles of Bc columns (query tiles do not change a row's
// forward arithmetic: a fully masked tile leaves m, l and O~ exactly unchanged):
//   S_s   = r_s(scale * r_s(q.k_s))          q.k accumulated in `mac`
//   r_m   = max_s S_s; m' = r_m, or the stabilized shift (below); m_new = max(m, m')
//   alpha = r_a(exp(r_s(m - m_new)))          (0 on the first tile)
//   P~_s  = r_p(exp(r_s(S_s - m_new)))
//   l     = r_l(r_l(alpha * l) + sum_s P~_s)   row sum accumulated in `lsum_mac`
//   O~    = r_a(r_a(alpha * O~) + r_a(P~ V))   the tile's P~V accumulated in `mac`, then
//                                             rounded to the accumulator's format (with a
//                                             BF16 accumulator this is the rounding in which
//                                             Qiu & Yao's bias arises; o_tilde_bits narrows
//                                             these three roundings only)
//   O = r_o(O~ / l); o32 = O~ / l in the wide format; lse = m + log l (wide)
// o_tilde_gain instead sets O~ = u + gain * (r - u), u = alpha * O~ + P~V exact and r the
// update rounded as above, in the wide format: the update's rounding error times the gain.
// o_tilde_scope confines either amplifier to the O~ updates of tied key tiles (tied), or to
// as many untied tiles as there are tied ones in the head's call (untied_matched; the tiles
// chosen by o_tilde_matched_tiles); the other updates round into accum. tie_break lowers the
// j-th tied score of a tied tile by j * tie_break inside exp (P~ only).
// r_s, r_a, r_l, r_p, r_o round to scores, accum, lsum, probs, out (docs/numerics.md states
// these conventions for every backend). Inner r_x(...) marks rounding of an
// intermediate result, applied only under every_op / every_mac (n.round_ops).
//
// Stabilized flash (Qiu & Yao), per key tile before exponentiation: if more than one score
// is within tie_tol of r_m, the tile's maximum is replaced by m' = beta*r_m (r_m > 0) or
// 0 (r_m < 0). Exact arithmetic is unchanged (O and lse do not depend on the m used); in
// rounded arithmetic the tied entries get P~ = exp(-shift) < 1 instead of exactly 1.
// Underflow, defined: the shift m' - r_m is capped at max_shift (default
// ln(1/min_normal(probs)) / 2: 43.7 for BF16/FP32, 4.85 for FP16), so P~ of the tied maxima
// is at least sqrt(min_normal) and l > 0 always; without the cap beta = 7 and r_m = 20 give
// exp(-120) = 0, l = 0 and O = 0/0. The cap changes nothing where the shift is below it.
//
// Backward (flash): P = r_p(exp(r_s(S - lse))) recomputed; dP = r_a(dO.v_s);
// dS = r_g(P * r_a(dP - delta)); per (query tile, key tile) the partial sums of
// dQ = dS K, dK = dS^T Q, dV = P^T dO are accumulated in `mac` and added to FP32-like
// accumulators in `accum`; finally dQ, dK (times scale) and dV are rounded to `grads`.
// Baseline backward uses the materialised P: dP = r_g(dO.v); delta = rowsum(P * dP);
// dS = r_g(P * (dP - delta)); each gradient is one GEMM rounded once to `grads`.
#include "attention/head_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/error.h"

namespace st {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

DType wide_of(const AttnNumerics& n) { return n.low == DType::F64 ? DType::F64 : DType::F32; }

// Partial sums in format mac. The format test sits outside the loops so the FP32 and FP64
// paths vectorise (axpy) or run a plain FMA chain (dot).
inline void mac_sum(double& s, double a, DType mac) {
  s = mac == DType::F64 ? s + a : round_fmt(s + a, mac);
}

double dot(const double* a, const double* b, int n, DType mac) {
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
void axpy(double* acc, double w, const double* x, int n, DType mac) {
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
void row_dots(const double* a, const double* bt, int T, int c0, int c1, int d, DType mac,
              double* out) {
  std::fill(out, out + (c1 - c0), 0.0);
  for (int j = 0; j < d; ++j) axpy(out, a[j], bt + static_cast<size_t>(j) * T + c0, c1 - c0, mac);
}

std::vector<double> transpose(const std::vector<double>& x, int T, int d) {
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

Ctx make_ctx(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d, int Tk = -1,
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

std::vector<double> rounded(const double* x, size_t count, DType f) {
  std::vector<double> r(x, x + count);
  for (double& v : r) v = round_fmt(v, f);
  return r;
}

double min_normal(DType f) {
  switch (f) {
    case DType::F16: return 6.103515625e-05;   // 2^-14
    case DType::F64: return 2.2250738585072014e-308;
    default: return 1.1754943508222875e-38;   // FP32 and BF16: 2^-126
  }
}

// Row statistics from the row's scores (s <= last).
void row_stats(const Ctx& c, const double* S, int last, AttentionHeadStats& st) {
  double mx = kNegInf;
  for (int s = 0; s <= last; ++s) mx = std::max(mx, S[s]);
  int tied = 0, first_tile = -1;
  bool same_tile = false;
  for (int s = 0; s <= last; ++s)
    if (S[s] >= mx - c.cfg.tie_tol) {
      ++tied;
      const int tile = s / c.bc;
      if (first_tile == tile) same_tile = true;
      if (first_tile < 0) first_tile = tile;
    }
  double sum = 0;
  for (int s = 0; s <= last; ++s) sum += std::exp(S[s] - mx);
  double h = 0;
  for (int s = 0; s <= last; ++s) {
    const double p = std::exp(S[s] - mx) / sum;
    if (p > 0) h -= p * std::log(p);
  }
  st.max_logit = std::max(st.max_logit, mx);
  ++st.rows;
  st.tied_rows += tied > 1;
  st.tied_in_tile += tied > 1 && same_tile;
  st.entropy_sum += h;
}

int significand_bits(DType f) {
  switch (f) {
    case DType::BF16: return 8;
    case DType::F16: return 11;
    case DType::F32: return 24;
    default: return 53;
  }
}

// x with its significand cut to `bits` bits (toward zero).
double truncate_bits(double x, int bits) {
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m * 2^e, 0.5 <= m < 1
  return std::ldexp(std::trunc(std::ldexp(m, bits)), e - bits);
}

// tie_shift: exact_sum (see core/attention.h). Moves the stabilized maximum mp up, over
// values representable in the accumulator's format, to the first one at which the tied
// entries' P~ = p (rounded to probs) is not a power of two and ties * p is exact in l's
// format, so l = ties * p + ... carries no rounding of the tie sum. First candidate: p cut
// to fewer significand bits (reached exactly when accum is wide); then upward steps of one
// unit in the last place of mp (a BF16 maximum moves P~ by several percent a step).
// Returns mp unchanged if no such value is found within 512 steps.
double exact_sum_max(const Ctx& c, double rm, double mp, int ties) {
  const AttnNumerics& n = c.n;
  const auto p_of = [&](double m) {
    return round_fmt(std::exp(c.rop(rm - m, n.scores)), n.probs);
  };
  const auto ok = [&](double p) {
    int e = 0;
    return p > 0 && std::frexp(p, &e) != 0.5 && round_fmt(ties * p, n.lsum) == ties * p;
  };
  const double p0 = p_of(mp);
  if (ok(p0)) return mp;
  for (int bits = significand_bits(n.probs) - 1; bits >= 2; --bits) {
    const double pt = truncate_bits(p0, bits);
    if (!ok(pt)) continue;
    const double m = round_fmt(rm - std::log(pt), n.accum);
    if (m >= mp && ok(p_of(m))) return m;
    break;
  }
  double m = mp;
  for (int i = 0; i < 512; ++i) {
    int e = 0;
    std::frexp(m, &e);
    const double ulp = std::ldexp(1.0, e - significand_bits(n.accum));
    m = round_fmt(m + std::max(ulp, std::ldexp(std::fabs(rm) + 1.0, -40)), n.accum);
    if (ok(p_of(m))) return m;
  }
  return mp;
}

// Entries of the row (s <= last) with r_p(exp(r_s(S - shift))) == 1 in P's format: shift =
// lse counts the normalised P as the flash backward recomputes it (flash_row_p_dp), shift =
// the row max the unnormalised exponentials of one key tile spanning the row.
int64_t probs_ones(const Ctx& c, const double* S, int last, double shift) {
  int64_t ones = 0;
  for (int s = 0; s <= last; ++s)
    ones += round_fmt(std::exp(c.rop(S[s] - shift, c.n.scores)), c.n.probs) == 1.0;
  return ones;
}

void baseline_forward(const Ctx& c, const double* q, const double* kt, const double* v,
                      HeadForward& fw, bool want_stats) {
  const auto& n = c.n;
  const int T = c.T, Tk = c.Tk, d = c.d;
  fw.P.assign(static_cast<size_t>(T) * Tk, 0.0);
  std::vector<double> S(Tk), e(std::max(Tk, d));
  for (int t = 0; t < T; ++t) {
    const int last = c.last_key(t);
    double mx = kNegInf;
    c.score_row(t, q ? q + t * d : nullptr, kt, 0, last + 1, S.data());
    for (int s = 0; s <= last; ++s) mx = std::max(mx, S[s]);
    double sum = 0;
    for (int s = 0; s <= last; ++s) {
      e[s] = round_fmt(std::exp(c.rop(S[s] - mx, n.scores)), n.accum);
      mac_sum(sum, e[s], n.lsum_mac);
    }
    sum = round_fmt(sum, n.lsum);
    double* P = fw.P.data() + static_cast<size_t>(t) * Tk;
    for (int s = 0; s <= last; ++s) P[s] = round_fmt(e[s] / sum, n.probs);
    fw.lse[t] = round_fmt(mx + std::log(sum), wide_of(n));
    std::fill(e.begin(), e.begin() + d, 0.0);  // reused as the output row accumulator
    for (int s = 0; s <= last; ++s) axpy(e.data(), P[s], v + s * d, d, n.mac);
    for (int j = 0; j < d; ++j) {
      fw.o32[t * d + j] = round_fmt(e[j], wide_of(n));
      fw.o[t * d + j] = round_fmt(e[j], n.out);
    }
    if (want_stats) {
      row_stats(c, S.data(), last, fw.stats);
      for (int s = 0; s <= last; ++s) fw.stats.p_one += P[s] == 1.0;
      fw.stats.p_tilde_one += probs_ones(c, S.data(), last, mx);
    }
  }
}

// The untied_matched scope's tiles of a head's call: per (row, key tile) in row order, tied
// and its maximum from one pass over the scores (the forward's own, recomputed).
std::vector<uint8_t> matched_tiles(const Ctx& c, const double* q, const double* kt) {
  std::vector<uint8_t> tied;
  std::vector<float> tile_max;
  std::vector<double> S(c.Tk);
  for (int t = 0; t < c.T; ++t) {
    const int last = c.last_key(t);
    for (int c0 = 0; c0 <= last; c0 += c.bc) {
      const int c1 = std::min(c0 + c.bc, last + 1);
      c.score_row(t, q ? q + t * c.d : nullptr, kt, c0, c1, S.data());
      double rm = kNegInf;
      for (int s = c0; s < c1; ++s) rm = std::max(rm, S[s]);
      tied.push_back(tile_ties(S.data() + c0, c1 - c0, rm, c.cfg.tie_tol) > 1);
      tile_max.push_back(static_cast<float>(rm));
    }
  }
  return o_tilde_matched_tiles(tied, tile_max);
}

void flash_forward(const Ctx& c, const double* q, const double* kt, const double* v,
                   HeadForward& fw, bool want_stats) {
  const auto& n = c.n;
  const int T = c.T, d = c.d;
  const bool stab = c.cfg.kind == AttentionKind::StabilizedFlash;
  const double cap = stabilized_max_shift(c.cfg, n.probs);
  const std::vector<uint8_t> matched = n.o_tilde_scope == OTildeScope::UntiedMatched
                                           ? matched_tiles(c, q, kt)
                                           : std::vector<uint8_t>{};
  size_t tile_index = 0;
  // The tie test runs only where something reads it (plain flash skips it).
  const bool test_ties = stab || n.o_tilde_scope != OTildeScope::All || n.tie_break > 0;
  std::vector<double> S(c.Tk), P(c.bc), acc(d), pv(d);
  for (int t = 0; t < T; ++t) {
    const int last = c.last_key(t);
    double m = kNegInf, l = 0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int c0 = 0; c0 <= last; c0 += c.bc) {
      const int c1 = std::min(c0 + c.bc, last + 1);
      double rm = kNegInf;
      c.score_row(t, q ? q + t * d : nullptr, kt, c0, c1, S.data());
      for (int s = c0; s < c1; ++s) rm = std::max(rm, S[s]);
      const int ties = test_ties ? tile_ties(S.data() + c0, c1 - c0, rm, c.cfg.tie_tol) : 0;
      const bool narrow = o_tilde_narrows(n.o_tilde_scope, ties > 1, matched, tile_index++);
      double mp = rm;
      if (stab) {
        if (ties > 1 && rm != 0.0) {
          const double shift = rm > 0 ? (c.cfg.beta - 1.0) * rm : -rm;
          mp = round_fmt(rm + std::min(shift, cap), n.accum);
          if (c.cfg.tie_shift == TieShift::ExactSum) mp = exact_sum_max(c, rm, mp, ties);
        }
      }
      const double m_new = std::max(m, mp);
      const double alpha = m == kNegInf ? 0.0 : round_fmt(std::exp(c.rop(m - m_new, n.scores)), n.accum);
      double rowsum = 0;
      int broken = 0;  // tie_break: tied scores seen so far in this tile
      for (int s = c0; s < c1; ++s) {
        double sv = S[s];
        if (n.tie_break > 0 && ties > 1 && S[s] >= rm - c.cfg.tie_tol)
          sv = round_fmt(S[s] - broken++ * n.tie_break, wide_of(n));
        P[s - c0] = round_fmt(std::exp(c.rop(sv - m_new, n.scores)), n.probs);
        mac_sum(rowsum, P[s - c0], n.lsum_mac);
        if (want_stats) fw.stats.p_tilde_one += P[s - c0] == 1.0;
      }
      l = round_fmt(c.rop(alpha * l, n.lsum) + rowsum, n.lsum);
      std::fill(pv.begin(), pv.end(), 0.0);
      for (int s = c0; s < c1; ++s) axpy(pv.data(), P[s - c0], v + s * d, d, n.mac);
      const bool gain = narrow && n.o_tilde_gain;
      for (int j = 0; j < d; ++j) {
        const double scaled = alpha * acc[j];
        const double r = c.r_ot((n.round_ops ? c.r_ot(scaled, narrow) : scaled) +
                                    c.r_ot(pv[j], narrow),
                                narrow);
        // o_tilde_gain: the update's rounding error (against its exact value) times the gain.
        acc[j] = gain ? round_fmt((scaled + pv[j]) + n.o_tilde_gain * (r - (scaled + pv[j])),
                                  wide_of(n))
                      : r;
      }
      m = m_new;
    }
    for (int j = 0; j < d; ++j) {
      fw.o32[t * d + j] = round_fmt(acc[j] / l, wide_of(n));
      fw.o[t * d + j] = round_fmt(acc[j] / l, n.out);
    }
    fw.lse[t] = round_fmt(m + std::log(l), wide_of(n));
    if (want_stats) {  // S holds the whole row now; P = 1 as the backward recomputes it
      row_stats(c, S.data(), last, fw.stats);
      fw.stats.p_one += probs_ones(c, S.data(), last, fw.lse[t]);
    }
  }
}

}  // namespace

std::vector<uint8_t> o_tilde_matched_tiles(const std::vector<uint8_t>& tied,
                                           const std::vector<float>& tile_max) {
  ST_CHECK(tied.size() == tile_max.size(), "o_tilde_matched_tiles: ", tied.size(), " tie flags, ",
           tile_max.size(), " maxima");
  // splitmix64's finaliser of (tile index, the maximum's FP32 bits): a fixed function of the
  // scores, so the choice is reproducible and the same in the lab and the fast path.
  const auto hash = [&](size_t i) {
    uint32_t bits;
    std::memcpy(&bits, &tile_max[i], 4);
    uint64_t z = (static_cast<uint64_t>(i) << 32 | bits) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::vector<std::pair<uint64_t, size_t>> untied;
  size_t n_tied = 0;
  for (size_t i = 0; i < tied.size(); ++i) {
    if (tied[i])
      ++n_tied;
    else
      untied.emplace_back(hash(i), i);
  }
  const size_t k = std::min(n_tied, untied.size());
  std::partial_sort(untied.begin(), untied.begin() + k, untied.end());
  std::vector<uint8_t> chosen(tied.size(), 0);
  for (size_t j = 0; j < k; ++j) chosen[untied[j].second] = 1;
  return chosen;
}

double stabilized_max_shift(const AttentionConfig& cfg, DType probs) {
  return cfg.max_shift > 0 ? cfg.max_shift : 0.5 * std::log(1.0 / min_normal(probs));
}

namespace {

// The forward of context c: q (T, d) or null with c.dots, kt (d, Tk) or null with c.dots,
// v (Tk, d), all rounded to n.qkv already.
void forward(const Ctx& c, const double* q, const double* kt, const double* v, HeadForward& fw,
             bool want_stats) {
  const size_t td = static_cast<size_t>(c.T) * c.d;
  fw.o.assign(td, 0.0);
  fw.o32.assign(td, 0.0);
  fw.lse.assign(c.T, 0.0);
  fw.P.clear();
  fw.stats = AttentionHeadStats{};
  if (c.flash)
    flash_forward(c, q, kt, v, fw, want_stats);
  else
    baseline_forward(c, q, kt, v, fw, want_stats);
}

}  // namespace

void head_forward(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                  const double* q, const double* k, const double* v, HeadForward& fw,
                  bool want_stats) {
  const Ctx c = make_ctx(cfg, n, T, d);
  const size_t td = static_cast<size_t>(T) * d;
  const auto qr = rounded(q, td, n.qkv), kr = rounded(k, td, n.qkv), vr = rounded(v, td, n.qkv);
  const auto kt = transpose(kr, T, d);
  forward(c, qr.data(), kt.data(), vr.data(), fw, want_stats);
}

void head_forward_dots(const AttentionConfig& cfg, const AttnNumerics& n, int T, int Tk, int d,
                       const double* dots, const double* v, HeadForward& fw, bool want_stats) {
  const Ctx c = make_ctx(cfg, n, T, d, Tk, dots);
  const auto vr = rounded(v, static_cast<size_t>(Tk) * d, n.qkv);
  forward(c, nullptr, nullptr, vr.data(), fw, want_stats);
}

namespace {

// P and dP of row t against keys [c0, c1) as the flash backward recomputes them.
// kt, vt: K and V transposed (d x T). P and dP are indexed from c0.
void flash_row_p_dp(const Ctx& c, const double* q, const double* kt, const double* vt,
                    const double* dout, double lse, int t, int c0, int c1, double* P,
                    double* dP) {
  const auto& n = c.n;
  c.score_row(t, q ? q + t * c.d : nullptr, kt, c0, c1, P - c0);
  row_dots(dout + t * c.d, vt, c.Tk, c0, c1, c.d, n.mac, dP);
  for (int s = c0; s < c1; ++s) {
    P[s - c0] = round_fmt(std::exp(c.rop(P[s - c0] - lse, n.scores)), n.probs);
    dP[s - c0] = round_fmt(dP[s - c0], n.accum);
  }
}

}  // namespace

namespace {

// delta for context c (see head_deltas); q, k: (T, d) and (Tk, d) unrounded, or null with
// c.dots; v: (Tk, d) unrounded.
std::vector<double> deltas(const Ctx& c, const double* q, const double* k, const double* v,
                           const HeadForward& fw, const double* dout) {
  const AttnNumerics& n = c.n;
  const int T = c.T, Tk = c.Tk, d = c.d;
  const size_t td = static_cast<size_t>(T) * d, tkd = static_cast<size_t>(Tk) * d;
  const auto dor = rounded(dout, td, n.grads);
  std::vector<double> delta(T);
  if (!c.flash || n.delta == DeltaMode::DpP) {
    const auto vr = rounded(v, tkd, n.qkv);
    const auto vt = transpose(vr, Tk, d);
    std::vector<double> qr, kt;
    if (!c.dots) {
      qr = rounded(q, td, n.qkv);
      kt = transpose(rounded(k, tkd, n.qkv), Tk, d);
    }
    std::vector<double> P(Tk), dP(Tk);
    for (int t = 0; t < T; ++t) {
      const int last = c.last_key(t);
      if (c.flash) {
        flash_row_p_dp(c, c.dots ? nullptr : qr.data(), c.dots ? nullptr : kt.data(), vt.data(),
                       dor.data(), fw.lse[t], t, 0, last + 1, P.data(), dP.data());
      } else {
        row_dots(dor.data() + t * d, vt.data(), Tk, 0, last + 1, d, n.mac, dP.data());
        for (int s = 0; s <= last; ++s) {
          P[s] = fw.P[static_cast<size_t>(t) * Tk + s];
          dP[s] = round_fmt(dP[s], n.grads);
        }
      }
      delta[t] = round_fmt(dot(dP.data(), P.data(), last + 1, n.mac), n.accum);
    }
    return delta;
  }
  std::vector<double> ofp;  // the O that delta is formed from
  switch (n.delta) {
    case DeltaMode::O: ofp = fw.o; break;
    case DeltaMode::OFp32: ofp = fw.o32; break;
    case DeltaMode::OSplit:
      // O kept as the stored O (hi) plus a residual against the wide O in format low.
      ofp = fw.o32;
      for (size_t i = 0; i < ofp.size(); ++i) ofp[i] = fw.o[i] + round_fmt(fw.o32[i] - fw.o[i], n.low);
      break;
    case DeltaMode::Fp32Recompute: {
      // The same algorithm with every point in the wide format (Q, K, V are what they are).
      AttnNumerics w = n;
      w.scores = w.probs = w.accum = w.lsum = w.out = w.mac = w.lsum_mac = wide_of(n);
      w.round_ops = false;
      w.o_tilde_bits = 0;
      w.o_tilde_gain = 0;
      HeadForward re;
      if (c.dots)
        head_forward_dots(c.cfg, w, T, Tk, d, c.dots, v, re);
      else
        head_forward(c.cfg, w, T, d, q, k, v, re);
      ofp = re.o;
      break;
    }
    default: break;
  }
  for (int t = 0; t < T; ++t)
    delta[t] = round_fmt(dot(dor.data() + t * d, ofp.data() + t * d, d, n.mac), n.accum);
  return delta;
}

}  // namespace

std::vector<double> head_deltas(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                                const double* q, const double* k, const double* v,
                                const HeadForward& fw, const double* dout) {
  return deltas(make_ctx(cfg, n, T, d), q, k, v, fw, dout);
}

std::vector<double> head_deltas_dots(const AttentionConfig& cfg, const AttnNumerics& n, int T,
                                     int Tk, int d, const double* dots, const double* v,
                                     const HeadForward& fw, const double* dout) {
  return deltas(make_ctx(cfg, n, T, d, Tk, dots), nullptr, nullptr, v, fw, dout);
}

void head_backward(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                   const double* q, const double* k, const double* v, const HeadForward& fw,
                   const double* dout, double* dq, double* dk, double* dv) {
  const Ctx c = make_ctx(cfg, n, T, d);
  const size_t td = static_cast<size_t>(T) * d;
  const auto qr = rounded(q, td, n.qkv), kr = rounded(k, td, n.qkv), vr = rounded(v, td, n.qkv);
  const auto dor = rounded(dout, td, n.grads);
  const auto kt = transpose(kr, T, d), vt = transpose(vr, T, d);
  const std::vector<double> delta = head_deltas(cfg, n, T, d, q, k, v, fw, dout);
  const DType acc_f = c.flash ? n.accum : n.mac;  // baseline: one GEMM, one rounding
  std::vector<double> aq(td, 0.0), ak(td, 0.0), av(td, 0.0);
  std::vector<double> P(static_cast<size_t>(c.br) * c.bc), dS(P.size()), dP(c.bc);
  std::vector<double> part(d), pv(d);
  for (int r0 = 0; r0 < T; r0 += c.br) {
    const int r1 = std::min(r0 + c.br, T);
    const int key_end = c.cfg.causal ? r1 : T;
    for (int c0 = 0; c0 < key_end; c0 += c.bc) {
      const int c1 = std::min(c0 + c.bc, key_end);
      // P and dS of the (query tile, key tile) block; masked entries are 0.
      for (int t = r0; t < r1; ++t) {
        double* Pr = P.data() + static_cast<size_t>(t - r0) * c.bc;
        double* dSr = dS.data() + static_cast<size_t>(t - r0) * c.bc;
        std::fill(Pr, Pr + c.bc, 0.0);
        std::fill(dSr, dSr + c.bc, 0.0);
        const int hi = std::min(c1, c.last_key(t) + 1);
        if (hi <= c0) continue;
        if (c.flash) {
          flash_row_p_dp(c, qr.data(), kt.data(), vt.data(), dor.data(), fw.lse[t], t, c0, hi,
                         Pr, dP.data());
        } else {
          row_dots(dor.data() + t * d, vt.data(), T, c0, hi, d, n.mac, dP.data());
          for (int s = c0; s < hi; ++s) {
            Pr[s - c0] = fw.P[static_cast<size_t>(t) * T + s];
            dP[s - c0] = round_fmt(dP[s - c0], n.grads);
          }
        }
        for (int s = c0; s < hi; ++s)
          dSr[s - c0] =
              round_fmt(Pr[s - c0] * c.rop(dP[s - c0] - delta[t], n.accum), n.grads);
      }
      // dQ rows: partial over this key tile, added to the row accumulator.
      for (int t = r0; t < r1; ++t) {
        const double* dSr = dS.data() + static_cast<size_t>(t - r0) * c.bc;
        std::fill(part.begin(), part.end(), 0.0);
        const int hi = std::min(c1, c.last_key(t) + 1);  // masked keys contribute nothing
        for (int s = c0; s < hi; ++s) axpy(part.data(), dSr[s - c0], kr.data() + s * d, d, n.mac);
        for (int j = 0; j < d; ++j) aq[t * d + j] = round_fmt(aq[t * d + j] + part[j], acc_f);
      }
      // dK, dV rows: partial over this query tile.
      for (int s = c0; s < c1; ++s) {
        std::fill(part.begin(), part.end(), 0.0);
        std::fill(pv.begin(), pv.end(), 0.0);
        for (int t = c.cfg.causal ? std::max(r0, s) : r0; t < r1; ++t) {
          const double w = dS[static_cast<size_t>(t - r0) * c.bc + (s - c0)];
          const double p = P[static_cast<size_t>(t - r0) * c.bc + (s - c0)];
          axpy(part.data(), w, qr.data() + t * d, d, n.mac);
          axpy(pv.data(), p, dor.data() + t * d, d, n.mac);
        }
        for (int j = 0; j < d; ++j) {
          ak[s * d + j] = round_fmt(ak[s * d + j] + part[j], acc_f);
          av[s * d + j] = round_fmt(av[s * d + j] + pv[j], acc_f);
        }
      }
    }
  }
  for (size_t i = 0; i < td; ++i) {
    dq[i] = round_fmt(aq[i] * c.scale, n.grads);
    dk[i] = round_fmt(ak[i] * c.scale, n.grads);
    dv[i] = round_fmt(av[i], n.grads);
  }
}

}  // namespace st
