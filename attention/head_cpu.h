// One attention head, forward and backward, for every backend and rounding rule: the
// numerics lab behind the CPU attention backends, attn_deviation and the bias experiments.
// Values travel in FP64 and are rounded to their format at each rounding point, so the
// same code runs every format (BF16, FP16, FP32, FP64) and every rule.
#pragma once
#include <cstdint>
#include <vector>

#include "core/attention.h"

namespace st {

struct HeadForward {
  std::vector<double> o;    // (T, d) stored O, in format n.out
  std::vector<double> lse;  // (T) natural log-sum-exp of the scaled scores, in the wide format
  std::vector<double> o32;  // (T, d) O before its final rounding, in the wide format (flash)
  std::vector<double> P;    // (T, T) materialised probabilities (baseline only)
  AttentionHeadStats stats;
};

// q, k, v: (T, d) row-major; rounded to n.qkv on entry. The wide format (FP32, or FP64 when
// n.low is FP64) holds lse and o32.
void head_forward(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                  const double* q, const double* k, const double* v, HeadForward& fw,
                  bool want_stats = false);
// The same with the dot products given instead of Q and K (the numerics experiments choose
// scores exactly): dots (T, Tk) holds q_t.k_s as the kernel's matmul would produce it, to
// which the scale and the score rounding are applied as in head_forward; v is (Tk, d) and
// the outputs have T rows. Non-causal unless Tk == T. Equals head_forward bit for bit when
// dots are the q.k sums head_forward forms (exact ones, e.g. sums of two BF16 values).
void head_forward_dots(const AttentionConfig& cfg, const AttnNumerics& n, int T, int Tk, int d,
                       const double* dots, const double* v, HeadForward& fw,
                       bool want_stats = false);
// dout: (T, d). Writes dq, dk, dv (T, d) in format n.grads. fw is this head's forward.
void head_backward(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                   const double* q, const double* k, const double* v, const HeadForward& fw,
                   const double* dout, double* dq, double* dk, double* dv);
// delta_t for every row as the backward forms it under n.delta (dp_p: rowsum(dP * P) with
// P recomputed from lse), in format n.accum. head_backward uses exactly these values.
std::vector<double> head_deltas(const AttentionConfig& cfg, const AttnNumerics& n, int T, int d,
                                const double* q, const double* k, const double* v,
                                const HeadForward& fw, const double* dout);

std::vector<double> head_deltas_dots(const AttentionConfig& cfg, const AttnNumerics& n, int T,
                                     int Tk, int d, const double* dots, const double* v,
                                     const HeadForward& fw, const double* dout);

// Scores of a key tile (w of them) within tol of the tile's maximum rm: more than one means
// the tile is tied (stabilized flash's test, and o_tilde_scope's).
template <class F>
int tile_ties(const F* S, int w, double rm, double tol) {
  int ties = 0;
  for (int i = 0; i < w; ++i) ties += S[i] >= rm - tol;
  return ties;
}

// o_tilde_scope untied_matched: given, for each (row, key tile) of a head's forward call in
// row order, whether the tile is tied and its maximum score, marks as many untied tiles as
// there are tied ones (all untied ones if fewer): those with the smallest hash of (index,
// the maximum's FP32 bits), a pseudo-random choice fixed by the scores.
std::vector<uint8_t> o_tilde_matched_tiles(const std::vector<uint8_t>& tied,
                                           const std::vector<float>& tile_max);

// Whether o_tilde_bits narrows the O~ update of key tile `index` (row order) of a call.
inline bool o_tilde_narrows(OTildeScope scope, bool tied, const std::vector<uint8_t>& matched,
                            size_t index) {
  switch (scope) {
    case OTildeScope::Tied: return tied;
    case OTildeScope::UntiedMatched: return matched[index] != 0;
    default: return true;
  }
}

// The shift cap used by stabilized flash for P~ in format f (see head_cpu.cpp).
double stabilized_max_shift(const AttentionConfig& cfg, DType probs);

}  // namespace st
