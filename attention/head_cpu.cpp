// The numerics lab: one head of baseline, flash (FlashAttention-2) and stabilized flash
// attention with every rounding point explicit (formats in core/attention_numerics.h); this
// file the forward, head_cpu_backward.cpp the backward.
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
#include "attention/head_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "attention/head_cpu_internal.h"
#include "core/error.h"

namespace st {
using namespace head_lab;  // the context and mac loops shared with the backward
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

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

}  // namespace st
