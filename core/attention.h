// One attention interface for every backend method (baseline here; flash and stabilized
// flash plug in behind the same calls). q, k, v arrive packed as GPT-2's c_attn output.
//   qkv  (B, T, 3C): q = [..., 0:C], k = [..., C:2C], v = [..., 2C:3C]; head h uses
//        columns [h*HS, (h+1)*HS) of each third, HS = C / NH.
//   out  (B, T, C) heads concatenated; lse (B, NH, T) natural-log row log-sum-exp of the
//        scaled, masked scores (kept in FP32, or FP64 in the FP64 reference mode).
// An Attention object belongs to one layer and may keep what its backward needs.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/attention_numerics.h"
#include "core/tensor.h"

namespace st {

// Cudnn: NVIDIA's fused flash attention through cuDNN's graph API (cuda/attention_cudnn.cu);
// GPU only, with cuDNN's own rounding (docs/numerics.md, "cuDNN"): none of the attention.*
// rounding settings apply to it.
enum class AttentionKind { Baseline, Flash, StabilizedFlash, Cudnn };

// How stabilized flash picks the shifted maximum of a tile with tied maxima.
enum class TieShift {
  Beta,      // Qiu & Yao: m' = beta * r_m (r_m > 0) or 0, capped by max_shift
  ExactSum,  // beta's m', then moved up to the nearest value at which the tied entries'
             // P~ = p is not a power of two and ties * p is exact in l's format: with 3 or
             // more ties a BF16 l = ties * p otherwise rounds, biasing O (docs/numerics.md)
};
TieShift parse_tie_shift(const std::string& s);  // beta | exact_sum
// The CUDA flash kernels: mma_sync (cuda/flash_fwd.cuh, flash_bwd.cuh; sm_80 and later) or
// sm90 (Hopper only, tiles (128, 128): cuda/flash_fwd_sm90.cuh and flash_bwd_sm90.cuh, TMA +
// wgmma, warp-specialised; the same numerics).
// The CPU backend has one implementation and ignores the choice.
enum class FlashKernel { MmaSync, Sm90 };
FlashKernel parse_flash_kernel(const std::string& s);  // mma_sync | sm90
const char* flash_kernel_name(FlashKernel k);
const char* tie_shift_name(TieShift t);
AttentionKind parse_attention_kind(const std::string& s);  // baseline|flash|stabilized_flash|cudnn
const char* attention_kind_name(AttentionKind k);

struct AttentionConfig {
  AttentionKind kind = AttentionKind::Baseline;
  bool causal = true;
  // Rounding: the rule sets every point's format from the model's compute format; the
  // optional overrides then replace single points (see core/attention_numerics.h).
  RoundingRule rule = RoundingRule::Gpu;
  std::optional<DType> qkv, scores, probs, accum, out, mac, grads;
  // The softmax row sum l and its partial sums: unless set, they follow accum and mac (so
  // accum: bf16 alone keeps l in BF16 as the paper's implementation does).
  std::optional<DType> lsum, lsum_mac;
  DeltaMode delta = DeltaMode::O;
  // Flash: fraction bits of O~ (AttnNumerics::o_tilde_bits); 0: O~ in accum's format.
  int o_tilde_bits = 0;
  // Flash: which O~ updates o_tilde_bits narrows, and the tie-breaking counterfactual
  // (AttnNumerics::o_tilde_scope and tie_break).
  double o_tilde_gain = 0;  // AttnNumerics::o_tilde_gain
  OTildeScope o_tilde_scope = OTildeScope::All;
  double tie_break = 0;
  // Flash tiles: Br query rows, Bc key columns; 0 means one tile spanning the sequence.
  int block_q = 64, block_k = 64;
  // Stabilized flash (Qiu & Yao): shift factor beta and tie tolerance. max_shift caps the
  // shift of the maximum (in units of the score) so exp never underflows in P~'s format:
  // 0 picks ln(1/min_normal(probs)) / 2 (see attention/head_cpu.cpp).
  double beta = 2.0, tie_tol = 1e-3, max_shift = 0.0;
  TieShift tie_shift = TieShift::Beta;
  FlashKernel cuda_kernel = FlashKernel::MmaSync;  // CUDA only
  std::vector<int> fp32_out_heads;  // heads of this layer whose stored O is FP32
  bool collect_stats = false;       // fill Attention::stats() in forward (the start value;
                                    // Attention::set_collect_stats changes it)

  AttnNumerics numerics(DType compute, int head) const;  // resolved for one head
};

// Per-head forward statistics (collect_stats), over the last forward call.
struct AttentionHeadStats {
  double max_logit = -1e300;  // largest scaled score
  int64_t rows = 0;           // query rows seen
  int64_t tied_rows = 0;      // rows whose maximum is tied (within tie_tol) by another key
  int64_t tied_in_tile = 0;   // of those, rows with two tied maxima inside one key tile
  // Entries equal to exactly 1 in P's format, two definitions (issue 21, finding 6):
  // p_one: of the normalised P, the same for every backend (baseline: its materialised P;
  // flash: P = r_p(exp(S - lse)) as the flash backward recomputes it). p_tilde_one: of the
  // unnormalised exponentials r_p(exp(S - m)): flash, P~ per key tile against the running
  // max (>= 1 per tile that raises it); baseline, m the row max (flash with one key tile).
  int64_t p_one = 0;
  // -1: not measured (cudnn: its P~ stays inside NVIDIA's kernel; hooks write no row).
  int64_t p_tilde_one = 0;
  double entropy_sum = 0;     // sum over rows of the softmax entropy (nats)
  double mean_entropy() const { return rows ? entropy_sum / rows : 0.0; }
  // One more query row. Every backend merges rows, then (batch, head) pairs, in a fixed
  // order, so entropy_sum (an FP64 sum) is reproducible.
  void add_row(double row_max_logit, bool tied, bool tied_within_tile, int64_t ones,
               int64_t tilde_ones, double entropy) {
    max_logit = std::max(max_logit, row_max_logit);
    ++rows;
    tied_rows += tied;
    tied_in_tile += tied_within_tile;
    p_one += ones;
    p_tilde_one += tilde_ones;
    entropy_sum += entropy;
  }
  // The rows of o added (statistics of disjoint rows).
  void merge(const AttentionHeadStats& o) {
    max_logit = std::max(max_logit, o.max_logit);
    rows += o.rows;
    tied_rows += o.tied_rows;
    tied_in_tile += o.tied_in_tile;
    p_one += o.p_one;
    p_tilde_one += o.p_tilde_one;
    entropy_sum += o.entropy_sum;
  }
};

class Attention {
 public:
  virtual ~Attention() = default;
  virtual std::string name() const = 0;
  // fmt: the compute format; every stored result is rounded to it.
  virtual void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head,
                       DType fmt) = 0;
  // dqkv is overwritten. out and lse are the forward's results for the same qkv.
  virtual void backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, int n_head, DType fmt) = 0;
  // Turns statistics collection in forward on or off (it starts as
  // AttentionConfig::collect_stats); off drops the last statistics. Backends without
  // statistics never fill stats_, so their stats() stays empty.
  void set_collect_stats(bool on) {
    collect_stats_ = on;
    if (!on) stats_.clear();
  }
  // Which implementation ran the last forward, where a backend has more than one (the CPU:
  // "fast" or "lab", attention/attention_cpu.h); empty otherwise.
  virtual std::string implementation() const { return ""; }
  // Statistics of the last forward, one entry per head (empty unless collect_stats).
  const std::vector<AttentionHeadStats>& stats() const { return stats_; }

 protected:
  Attention() = default;
  explicit Attention(bool collect_stats) : collect_stats_(collect_stats) {}
  // The backends' forward reads collect_stats_ and fills stats_ (one entry per head).
  bool collect_stats_ = false;
  std::vector<AttentionHeadStats> stats_;
};

}  // namespace st
