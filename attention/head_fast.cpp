// The attention fast path (see head_fast.h). Each step below names the lab's step it
// reproduces; the FP64 expressions are the lab's, written out in the same order (the
// project compiles with -ffp-contract=off, so none becomes an FMA).
#include "attention/head_fast.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/head_cpu.h"
#include "core/error.h"

namespace st {

float round_to_float(double x, DType f) {
  return f == DType::F32 ? static_cast<float>(x) : static_cast<float>(round_fmt(x, f));
}

bool head_fast_eligible(const AttentionConfig& cfg, const AttnNumerics& n) {
  const auto narrow = [](DType f) {
    return f == DType::F32 || f == DType::BF16 || f == DType::F16;
  };
  const bool flash = cfg.kind != AttentionKind::Baseline;
  return !n.round_ops && n.mac == DType::F32 && n.lsum_mac == DType::F32 &&
         narrow(n.low) && narrow(n.qkv) && narrow(n.scores) && narrow(n.probs) &&
         narrow(n.accum) && narrow(n.lsum) && narrow(n.out) && narrow(n.grads) &&
         (!flash || n.delta == DeltaMode::O || n.delta == DeltaMode::OFp32 ||
          n.delta == DeltaMode::OSplit) &&
         !(cfg.kind == AttentionKind::StabilizedFlash && cfg.tie_shift != TieShift::Beta);
}

HeadFastLayer head_fast_layer(const AttentionConfig& cfg, DType compute, int n_head) {
  HeadFastLayer r;
  r.eligible = true;
  for (int h = 0; h < n_head; ++h) {
    const AttnNumerics n = cfg.numerics(compute, h);
    r.eligible = r.eligible && head_fast_eligible(cfg, n);
    r.keeps_o32 |= cfg.kind != AttentionKind::Baseline &&
                   (n.delta == DeltaMode::OFp32 || n.delta == DeltaMode::OSplit);
  }
  return r;
}

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The lab's axpy with mac = FP32: acc[j] = fma(w, x[j], acc[j]).
inline void axpy(float* __restrict acc, float w, const float* __restrict x, int n) {
  for (int j = 0; j < n; ++j) acc[j] = std::fma(w, x[j], acc[j]);
}

// The lab's row_dots with mac = FP32: out[i] = a . b_(c0+i), b given transposed (bt: d x
// ld), one FMA chain over j per output.
void row_dots(const float* a, const float* bt, int ld, int c0, int c1, int d, float* out) {
  std::fill(out, out + (c1 - c0), 0.0f);
  for (int j = 0; j < d; ++j) axpy(out, a[j], bt + static_cast<size_t>(j) * ld + c0, c1 - c0);
}

// The lab's dot with mac = FP32.
inline float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

void transpose(const float* x, int T, int d, float* t) {
  for (int r = 0; r < T; ++r)
    for (int j = 0; j < d; ++j) t[static_cast<size_t>(j) * T + r] = x[static_cast<size_t>(r) * d + j];
}

struct Head {
  const AttentionConfig& cfg;
  const AttnNumerics& n;
  int T, d, bc, br;
  bool flash;
  double scale;     // the lab's: 1/sqrt(d) rounded to FP32
  const float* kt;  // K transposed (d x T)
  int last_key(int t) const { return cfg.causal ? t : T - 1; }
  // The lab's Ctx::score_row: S[s - c0] = r_s(scale * r_s(q.k_s)) for s in [c0, c1).
  void score_row(const float* q, int c0, int c1, float* S) const {
    row_dots(q, kt, T, c0, c1, d, S);
    if (n.scores == DType::F32) {
      for (int i = 0; i < c1 - c0; ++i) S[i] = static_cast<float>(static_cast<double>(S[i]) * scale);
    } else {
      for (int i = 0; i < c1 - c0; ++i) S[i] = round_to_float(static_cast<double>(S[i]) * scale, n.scores);
    }
  }
};

Head make_head(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d, const float* kt) {
  ST_CHECK(T > 0 && d > 0, "attention head: T = ", T, ", d = ", d);
  ST_CHECK(head_fast_eligible(cfg, n), "attention fast path called for numerics it does not "
           "reproduce: ", n.describe());
  const bool flash = cfg.kind != AttentionKind::Baseline;
  const int bc = flash && cfg.block_k > 0 ? cfg.block_k : T;
  const int br = flash && cfg.block_q > 0 ? cfg.block_q : T;
  const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  return Head{cfg, n, T, d, bc, br, flash, scale, kt};
}

// Per-thread scratch, grown on demand (heads run in parallel, each on one thread).
std::vector<float>& scratch(int which, size_t size) {
  thread_local std::vector<float> buf[8];
  if (buf[which].size() < size) buf[which].resize(size);
  return buf[which];
}

void baseline_forward(const Head& h, const float* q, const float* v, const HeadFastSaved& sv) {
  const AttnNumerics& n = h.n;
  const int T = h.T, d = h.d;
  float* S = scratch(2, T).data();
  float* e = scratch(3, T).data();
  float* acc = scratch(4, d).data();
  std::fill(sv.P, sv.P + static_cast<size_t>(T) * T, 0.0f);
  for (int t = 0; t < T; ++t) {
    const int last = h.last_key(t);
    h.score_row(q + static_cast<size_t>(t) * d, 0, last + 1, S);
    double mx = kNegInf;
    for (int s = 0; s <= last; ++s) mx = std::max(mx, static_cast<double>(S[s]));
    double sum = 0;
    for (int s = 0; s <= last; ++s) {
      e[s] = round_to_float(std::exp(static_cast<double>(S[s]) - mx), n.accum);
      sum = round_to_float(sum + e[s], n.lsum_mac);
    }
    sum = round_to_float(sum, n.lsum);
    float* P = sv.P + static_cast<size_t>(t) * T;
    for (int s = 0; s <= last; ++s) P[s] = round_to_float(e[s] / sum, n.probs);
    sv.lse[t] = static_cast<float>(mx + std::log(sum));
    std::fill(acc, acc + d, 0.0f);
    for (int s = 0; s <= last; ++s) axpy(acc, P[s], v + static_cast<size_t>(s) * d, d);
    float* o = sv.o + static_cast<size_t>(t) * d;
    for (int j = 0; j < d; ++j) o[j] = round_to_float(acc[j], n.out);
    if (sv.o32) std::copy(acc, acc + d, sv.o32 + static_cast<size_t>(t) * d);
  }
}

// The lab's matched_tiles: the untied_matched scope's tiles of this call.
std::vector<uint8_t> matched_tiles(const Head& h, const float* q) {
  std::vector<uint8_t> tied;
  std::vector<float> tile_max;
  float* S = scratch(2, h.bc).data();
  for (int t = 0; t < h.T; ++t) {
    const int last = h.last_key(t);
    for (int c0 = 0; c0 <= last; c0 += h.bc) {
      const int c1 = std::min(c0 + h.bc, last + 1), w = c1 - c0;
      h.score_row(q + static_cast<size_t>(t) * h.d, c0, c1, S);
      double rm = kNegInf;
      for (int i = 0; i < w; ++i) rm = std::max(rm, static_cast<double>(S[i]));
      tied.push_back(tile_ties(S, w, rm, h.cfg.tie_tol) > 1);
      tile_max.push_back(static_cast<float>(rm));
    }
  }
  return o_tilde_matched_tiles(tied, tile_max);
}

void flash_forward(const Head& h, const float* q, const float* v, const HeadFastSaved& sv) {
  const AttnNumerics& n = h.n;
  const int T = h.T, d = h.d;
  const bool stab = h.cfg.kind == AttentionKind::StabilizedFlash;
  const double cap = stabilized_max_shift(h.cfg, n.probs);
  // Rounding into O~'s format: accum, or o_tilde_bits fraction bits where the tile is in
  // o_tilde_scope (the lab's r_ot).
  const auto r_ot = [&n](double x, bool narrow) {
    return narrow && n.o_tilde_bits ? static_cast<float>(round_fraction_bits(x, n.o_tilde_bits))
                                    : round_to_float(x, n.accum);
  };
  const std::vector<uint8_t> matched = n.o_tilde_scope == OTildeScope::UntiedMatched
                                           ? matched_tiles(h, q)
                                           : std::vector<uint8_t>{};
  size_t tile_index = 0;
  // The tie test runs only where something reads it (the lab's test_ties).
  const bool test_ties = stab || n.o_tilde_scope != OTildeScope::All || n.tie_break > 0;
  float* S = scratch(2, h.bc).data();
  float* P = scratch(3, h.bc).data();
  float* acc = scratch(4, d).data();
  float* pv = scratch(5, d).data();
  for (int t = 0; t < T; ++t) {
    const int last = h.last_key(t);
    double m = kNegInf, l = 0;
    std::fill(acc, acc + d, 0.0f);
    for (int c0 = 0; c0 <= last; c0 += h.bc) {
      const int c1 = std::min(c0 + h.bc, last + 1), w = c1 - c0;
      h.score_row(q + static_cast<size_t>(t) * d, c0, c1, S);
      double rm = kNegInf;
      for (int i = 0; i < w; ++i) rm = std::max(rm, static_cast<double>(S[i]));
      const int ties = test_ties ? tile_ties(S, w, rm, h.cfg.tie_tol) : 0;
      const bool narrow = o_tilde_narrows(n.o_tilde_scope, ties > 1, matched, tile_index++);
      double mp = rm;
      if (stab) {
        if (ties > 1 && rm != 0.0) {
          const double shift = rm > 0 ? (h.cfg.beta - 1.0) * rm : -rm;
          mp = round_to_float(rm + std::min(shift, cap), n.accum);
        }
      }
      const double m_new = std::max(m, mp);
      const double alpha = m == kNegInf ? 0.0 : round_to_float(std::exp(m - m_new), n.accum);
      double rowsum = 0;
      int broken = 0;  // tie_break: tied scores seen so far in this tile (the lab's)
      for (int i = 0; i < w; ++i) {
        double si = S[i];
        if (n.tie_break > 0 && ties > 1 && si >= rm - h.cfg.tie_tol)
          si = static_cast<float>(si - broken++ * n.tie_break);
        P[i] = round_to_float(std::exp(si - m_new), n.probs);
        rowsum = round_to_float(rowsum + P[i], n.lsum_mac);
      }
      l = round_to_float(alpha * l + rowsum, n.lsum);
      std::fill(pv, pv + d, 0.0f);
      for (int i = 0; i < w; ++i) axpy(pv, P[i], v + static_cast<size_t>(c0 + i) * d, d);
      const bool gain = narrow && n.o_tilde_gain;
      for (int j = 0; j < d; ++j) {
        const double scaled = alpha * acc[j];
        const float r = r_ot(scaled + r_ot(pv[j], narrow), narrow);
        // o_tilde_gain (the lab's): the update's rounding error times the gain.
        const double u = scaled + pv[j];  // the exact update
        acc[j] = gain ? static_cast<float>(u + n.o_tilde_gain * (r - u)) : r;
      }
      m = m_new;
    }
    float* o = sv.o + static_cast<size_t>(t) * d;
    for (int j = 0; j < d; ++j) o[j] = round_to_float(acc[j] / l, n.out);
    if (sv.o32)
      for (int j = 0; j < d; ++j) sv.o32[static_cast<size_t>(t) * d + j] = static_cast<float>(acc[j] / l);
    sv.lse[t] = static_cast<float>(m + std::log(l));
  }
}

}  // namespace

void head_fast_forward(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                       const float* q, const float* k, const float* v, const HeadFastSaved& sv) {
  float* kt = scratch(0, static_cast<size_t>(T) * d).data();
  transpose(k, T, d, kt);
  const Head h = make_head(cfg, n, T, d, kt);
  ST_CHECK(h.flash || sv.P, "attention fast path: baseline needs storage for P");
  if (h.flash)
    flash_forward(h, q, v, sv);
  else
    baseline_forward(h, q, v, sv);
}

void head_fast_backward(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                        const float* q, const float* k, const float* v, const HeadFastSaved& sv,
                        const float* dout, float* dq, float* dk, float* dv) {
  const size_t td = static_cast<size_t>(T) * d;
  float* kt = scratch(0, td).data();
  float* vt = scratch(1, td).data();
  transpose(k, T, d, kt);
  transpose(v, T, d, vt);
  const Head h = make_head(cfg, n, T, d, kt);
  const DType acc_f = h.flash ? n.accum : n.mac;  // the lab's: baseline is one GEMM
  // delta (the lab's deltas()): flash from the stored O (or the FP32 O, or O split into
  // the stored O and a residual in the low format); baseline from dP and P, per row below.
  float* delta = scratch(2, T).data();
  if (h.flash) {
    float* ofp = scratch(3, d).data();
    for (int t = 0; t < T; ++t) {
      const float* o = sv.o + static_cast<size_t>(t) * d;
      const float* o32 = sv.o32 ? sv.o32 + static_cast<size_t>(t) * d : nullptr;
      for (int j = 0; j < d; ++j) {
        switch (n.delta) {
          case DeltaMode::OFp32: ofp[j] = o32[j]; break;
          case DeltaMode::OSplit:
            ofp[j] = static_cast<float>(o[j] + static_cast<double>(round_to_float(
                                                   static_cast<double>(o32[j]) - o[j], n.low)));
            break;
          default: ofp[j] = o[j]; break;
        }
      }
      delta[t] = round_to_float(dot(dout + static_cast<size_t>(t) * d, ofp, d), n.accum);
    }
  }
  float* aq = scratch(4, td).data();
  float* ak = scratch(5, td).data();
  float* av = scratch(6, td).data();
  std::fill(aq, aq + td, 0.0f);
  std::fill(ak, ak + td, 0.0f);
  std::fill(av, av + td, 0.0f);
  const size_t tile = static_cast<size_t>(h.br) * h.bc;
  std::vector<float>& blk = scratch(7, 2 * tile + 3 * static_cast<size_t>(d) + h.bc);
  float* P = blk.data();
  float* dS = P + tile;
  float* part = dS + tile;
  float* pv = part + d;
  float* dP = pv + d;
  for (int r0 = 0; r0 < T; r0 += h.br) {
    const int r1 = std::min(r0 + h.br, T);
    const int key_end = cfg.causal ? r1 : T;
    for (int c0 = 0; c0 < key_end; c0 += h.bc) {
      const int c1 = std::min(c0 + h.bc, key_end);
      for (int t = r0; t < r1; ++t) {
        float* Pr = P + static_cast<size_t>(t - r0) * h.bc;
        float* dSr = dS + static_cast<size_t>(t - r0) * h.bc;
        std::fill(Pr, Pr + h.bc, 0.0f);
        std::fill(dSr, dSr + h.bc, 0.0f);
        const int hi = std::min(c1, h.last_key(t) + 1);
        if (hi <= c0) continue;
        const float* dor = dout + static_cast<size_t>(t) * d;
        if (h.flash) {  // the lab's flash_row_p_dp
          h.score_row(q + static_cast<size_t>(t) * d, c0, hi, Pr);
          row_dots(dor, vt, T, c0, hi, d, dP);
          const double lse = sv.lse[t];
          for (int i = 0; i < hi - c0; ++i) {
            Pr[i] = round_to_float(std::exp(static_cast<double>(Pr[i]) - lse), n.probs);
            dP[i] = round_to_float(dP[i], n.accum);
          }
        } else {  // one tile: c0 = 0, hi = last + 1; delta from this row's dP and P
          row_dots(dor, vt, T, c0, hi, d, dP);
          const float* Ps = sv.P + static_cast<size_t>(t) * T;
          for (int s = c0; s < hi; ++s) {
            Pr[s - c0] = Ps[s];
            dP[s - c0] = round_to_float(dP[s - c0], n.grads);
          }
          delta[t] = round_to_float(dot(dP, Pr, hi), n.accum);
        }
        const double dt = delta[t];
        for (int i = 0; i < hi - c0; ++i) {
          const double diff = dP[i] - dt;
          dSr[i] = round_to_float(Pr[i] * diff, n.grads);
        }
      }
      // dQ rows: partial over this key tile, added to the row's accumulator.
      for (int t = r0; t < r1; ++t) {
        const float* dSr = dS + static_cast<size_t>(t - r0) * h.bc;
        std::fill(part, part + d, 0.0f);
        const int hi = std::min(c1, h.last_key(t) + 1);
        for (int s = c0; s < hi; ++s) axpy(part, dSr[s - c0], k + static_cast<size_t>(s) * d, d);
        float* a = aq + static_cast<size_t>(t) * d;
        for (int j = 0; j < d; ++j) a[j] = round_to_float(static_cast<double>(a[j]) + part[j], acc_f);
      }
      // dK, dV rows: partial over this query tile.
      for (int s = c0; s < c1; ++s) {
        std::fill(part, part + d, 0.0f);
        std::fill(pv, pv + d, 0.0f);
        for (int t = cfg.causal ? std::max(r0, s) : r0; t < r1; ++t) {
          const size_t at = static_cast<size_t>(t - r0) * h.bc + (s - c0);
          axpy(part, dS[at], q + static_cast<size_t>(t) * d, d);
          axpy(pv, P[at], dout + static_cast<size_t>(t) * d, d);
        }
        float* a = ak + static_cast<size_t>(s) * d;
        float* b = av + static_cast<size_t>(s) * d;
        for (int j = 0; j < d; ++j) {
          a[j] = round_to_float(static_cast<double>(a[j]) + part[j], acc_f);
          b[j] = round_to_float(static_cast<double>(b[j]) + pv[j], acc_f);
        }
      }
    }
  }
  for (size_t i = 0; i < td; ++i) {
    dq[i] = round_to_float(aq[i] * h.scale, n.grads);
    dk[i] = round_to_float(ak[i] * h.scale, n.grads);
    dv[i] = round_to_float(av[i], n.grads);
  }
}

}  // namespace st
