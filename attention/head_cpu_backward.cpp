// The numerics lab's backward (head_cpu.h: head_deltas, head_backward), every rounding
// point explicit; the forward and the conventions (r_s, r_a, r_p, r_g ...) are in
// head_cpu.cpp.
//
// Backward (flash): P = r_p(exp(r_s(S - lse))) recomputed; dP = r_a(dO.v_s);
// dS = r_g(P * r_a(dP - delta)); per (query tile, key tile) the partial sums of
// dQ = dS K, dK = dS^T Q, dV = P^T dO are accumulated in `mac` and added to FP32-like
// accumulators in `accum`; finally dQ, dK (times scale) and dV are rounded to `grads`.
// Baseline backward uses the materialised P: dP = r_g(dO.v); delta = rowsum(P * dP);
// dS = r_g(P * (dP - delta)); each gradient is one GEMM rounded once to `grads`.
// delta follows attention.delta (core/attention_numerics.h): rowsum(dO * O) with the stored
// O, the stored O plus its residual in format low, the wide O, or the O of a forward
// recomputed with every point in the wide format; or rowsum(dP * P).
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/head_cpu.h"
#include "attention/head_cpu_internal.h"

namespace st {
using namespace head_lab;  // the context and mac loops shared with the forward
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
