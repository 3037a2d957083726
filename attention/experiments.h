// Attention numerics experiments shared by apps/attn_deviation and the tests, built on the
// head lab (attention/head_cpu.h); nothing here reimplements attention.
//
// DeviationStats: max, mean and std of |a - b| over many elements (Golden et al.'s metric).
// InputDist: the input distributions of the lab's command line.
//
// Bias experiment (Qiu & Yao; docs/numerics.md): query rows whose scores are chosen
// exactly, V drawn from a distribution in the compute format, non-causal, `keys` keys. Mean
// signed error of O (and of delta for a chosen dO) against baseline attention in FP64 on the
// same inputs, with its standard error. The scores go in through the lab's dot-product entry
// point (head_forward_dots): row r's dot product with key s is X = hi + lo, hi = bf16(X'),
// lo = bf16(X' - hi), X' = target score * sqrt(d) -- at most 16 significant bits, so what a
// q.k sum in FP32 or FP64 would produce exactly, and every backend sees the same X; the score
// is X * scale rounded to the backend's score format. Tied keys get the same X, so the tie is
// exact in every format. A head call has rows_per_call query rows sharing one V draw; every
// row is counted. Rows of one call share V, so the standard error is taken over calls (the
// spread of the per-call mean errors), not over rows.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/attention.h"

namespace st {

class Rng;

// An input distribution: normal(mean, std), uniform(lo, hi), or outliers(mean, std, frac,
// scale) = normal(mean, std) with a fraction frac of the entries multiplied by scale.
struct InputDist {
  enum class Kind { Normal, Uniform, Outliers } kind = Kind::Normal;
  double a = 0, b = 1;           // normal/outliers: mean, std; uniform: lo, hi
  double frac = 0, scale = 1;    // outliers only
  double draw(Rng& rng) const;
  std::string str() const;       // the text parse_input_dist reads: "normal:0.7:0.3"
};
// "normal:MEAN:STD" | "uniform:LO:HI" | "outliers:MEAN:STD:FRAC:SCALE"; `what` names the flag.
InputDist parse_input_dist(const std::string& s, const std::string& what);

struct DeviationStats {
  double max = 0, sum = 0, sumsq = 0;
  int64_t n = 0;
  void add(double abs_err) {
    if (abs_err > max || abs_err != abs_err) max = abs_err;  // NaN sticks
    sum += abs_err;
    sumsq += abs_err * abs_err;
    ++n;
  }
  void merge(const DeviationStats& o);
  double mean() const { return n ? sum / n : 0.0; }
  double sd() const;  // population standard deviation of |err|
};

// |a[i] - b[i]| for i < count added to s.
void add_deviation(DeviationStats& s, const double* a, const double* b, size_t count);

// ---- Qiu & Yao tied-maximum bias ----

enum class BiasRows {
  TiedTile,  // `ties` equal maxima at `top`, all inside one key tile; others top - U(gap)
  TiedAny,   // the same, tie positions anywhere among the keys
  Single,    // one maximum at `top`; others top - U(gap)
  Diffuse,   // every score U(top - diffuse_width, top)
};
const char* bias_rows_name(BiasRows r);  // tied_tile | tied_any | single | diffuse
BiasRows parse_bias_rows(const std::string& s);

// Where flash's output accumulator lives (the rest follows the gpu rule in the compute format).
enum class BiasAccum {
  Bf16,  // accum = the compute format: O~, l, rescale factors in it (the paper's
         // implementation with BF16); baseline: its exponentials and row sum in it
  Fp32,  // gpu rule: O~ and l in FP32, O rounded to the compute format once at the end
};
const char* bias_accum_name(BiasAccum a);  // bf16_accum | fp32_accum

enum class DoutKind {
  Ones,    // dO = 1 everywhere: delta's error is the row sum of O's error (worst alignment)
  Normal,  // dO ~ N(0, 1) in BF16, independent of V and of the error: expected bias 0
};
const char* dout_kind_name(DoutKind k);  // ones | normal
DoutKind parse_dout_kind(const std::string& s);

struct BiasConfig {
  int rows = 4000;      // distinct rows per row kind (rounded up to whole head calls)
  int rows_per_call = 64;  // query rows per head call; they share the call's V
  int keys = 512;       // keys per row
  int d = 32;           // head dim
  int block_k = 64;     // flash key tile (query tile 64; it does not change the forward)
  int ties = 2;         // tied maxima (TiedTile, TiedAny); must fit in one tile
  double top = 5.0;     // score of the maximum
  double top_spread = 0;  // > 0: each row's maximum is top + U(-spread/2, spread/2)
  double gap_lo = 12, gap_hi = 20;  // the other keys: top - U(gap_lo, gap_hi)
  double diffuse_width = 4;         // Diffuse rows: U(top - width, top)
  InputDist v{InputDist::Kind::Normal, -1.0, 0.5};  // V, rounded to the compute format
  DType compute = DType::BF16;  // the compute format f (bf16 or fp16)
  // Overrides applied to every backend after the accumulator setting (unset: the rule's).
  std::optional<DType> scores, probs, lsum, lsum_mac, out;
  std::vector<double> betas{2.0, 7.0};  // stabilized flash, one backend per beta
  TieShift tie_shift = TieShift::Beta;  // stabilized flash's shifted maximum (core/attention.h)
  // Flash and stabilized flash: O~ narrowed to this many fraction bits (0: in accum) on the
  // tiles of o_tilde_scope (core/attention_numerics.h). A call's rows are all of one kind,
  // so untied_matched narrows nothing here: every call is all tied or all untied.
  int o_tilde_bits = 0;
  double o_tilde_gain = 0;  // or O~'s rounding error times this gain (0: off)
  OTildeScope o_tilde_scope = OTildeScope::All;
  std::vector<BiasRows> kinds{BiasRows::TiedTile, BiasRows::TiedAny, BiasRows::Single,
                              BiasRows::Diffuse};
  std::vector<BiasAccum> accums{BiasAccum::Bf16, BiasAccum::Fp32};
  bool baseline = true;  // include baseline attention
  bool deltas = true;    // also the delta bias, every delta mode
  std::vector<DoutKind> douts{DoutKind::Ones, DoutKind::Normal};
  uint64_t seed = 1;
  int threads = 0;  // OpenMP threads over head calls (0: default)
};

// One series: the per-row signed errors of one quantity, reduced.
struct BiasSeries {
  BiasRows kind;
  BiasAccum accum;
  std::string backend;   // flash | stabilized_b2 | baseline | fp64_rounded (O only)
  std::string quantity;  // o (stored, BF16) | o32 (before the final rounding) | delta
  std::string delta_mode;  // delta: o | o_split | o_fp32 | dp_p | fp32_recompute
  std::string dout;        // delta: ones | normal
  int64_t rows = 0;
  double mean = 0;      // mean over rows of the row's mean signed error (over head dims)
  double se = 0;        // standard error of `mean`: sd of the per-call means / sqrt(calls)
  double mean_abs = 0;  // mean |error| over rows and dims (scale of the error)
  double nonfinite = 0;  // fraction of rows with a NaN/Inf error (excluded from the above)
};

struct BiasReport {
  std::vector<BiasSeries> series;
  int rows_per_call = 0, calls_per_kind = 0;  // se is over the calls_per_kind calls
  double top_fp32 = 0, top_fp64 = 0;  // the maximum's score as FP32 flash / FP64 see it
  std::vector<double> same_tile_fraction;  // per kind in cfg.kinds: rows whose ties share a tile
  double seconds = 0;
  const BiasSeries* find(BiasRows kind, BiasAccum accum, const std::string& backend,
                         const std::string& quantity, const std::string& delta_mode = "",
                         const std::string& dout = "") const;
};

BiasReport run_bias_experiment(const BiasConfig& cfg);

// Backend label of stabilized flash with factor beta: "stabilized_b2", "stabilized_b7.5".
std::string stabilized_label(double beta);

}  // namespace st
