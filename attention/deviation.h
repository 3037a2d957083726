// One configuration of the numerics lab against an FP64 golden (Golden et al.'s numeric
// deviation, and the signed error that shows a bias): `attn_deviation run` and every entry of
// a sweep plan are one DeviationSpec each. docs/numerics.md states the rounding conventions.
//
// Inputs of head h: Q, K, V drawn from their distributions with a seed derived from (seed,
// T, d, h) only -- never from the backend, rule or tiles -- so runs that differ in those see
// identical inputs and their errors can be paired. Inputs are rounded to the Q/K/V format;
// the golden is baseline attention with every point in FP64 on those rounded inputs, so input
// rounding is not counted as error. With ties > 0 the scores go in through the lab's
// dot-product entry (head_forward_dots): q.k is formed exactly (FP64) and rounded to FP32 as
// the kernels' matmul produces it, then in every row that has at least `ties` keys, `ties`
// keys (anywhere among the row's keys) get the value max(other dots) + tie_gap * sqrt(d),
// identical, so the row has exactly `ties` maxima tie_gap above the next score.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attention/experiments.h"
#include "core/attention.h"

namespace st {

struct DeviationSpec {
  AttentionConfig attn;         // backend, causal, rule, overrides, tiles, beta, delta mode
  DType compute = DType::BF16;  // the compute format f the rule starts from
  int T = 1024, d = 64;
  InputDist q, k, v;            // default normal:0:1 each
  int ties = 0;                 // > 0: tied maxima per row (see above)
  double tie_gap = 1.0;         // in score units
  DoutKind dout = DoutKind::Normal;  // dO for the delta error: N(0, 1) or ones
  bool deltas = true;           // also delta = rowsum(dO * O) against FP64
  int heads = 8;
  uint64_t seed = 1;
  // The spec's settings as (column, value) pairs, formats resolved: CSV columns and the
  // JSON sidecar's keys. Identical lists mean identical runs.
  std::vector<std::pair<std::string, std::string>> columns() const;
  std::string key() const;  // the columns joined: identifies the run
};

// One head's result.
struct HeadDeviation {
  int head = 0;
  DeviationStats o32, o;     // |O - O_gold| before the final rounding / of the stored O
  double bias_o32 = 0, bias_o = 0;  // mean signed error over the head's elements
  double mean_abs_golden = 0;       // mean |O_gold|
  double delta_mean_abs = 0, delta_bias = 0;  // delta - delta_gold: mean |.| and mean
  int64_t tied_rows = 0, rows = 0;
  double seconds = 0;        // thread time of the head (backend, golden, delta)
};

// mean and standard error over heads of one per-head value.
struct MeanSe {
  double mean = 0, se = 0;
  int n = 0;
};
MeanSe mean_se(const std::vector<double>& x);

// Checks the spec (a one-line error naming the setting otherwise).
void validate(const DeviationSpec& s);
// Estimated CPU seconds (emulation cost model of the 2-core development machine).
double estimate_seconds(const DeviationSpec& s);
// Runs the spec's heads on `threads` OpenMP threads (0: default); progress(done, total) is
// called from one thread at a time after each head.
std::vector<HeadDeviation> run_deviation(
    const DeviationSpec& s, int threads,
    const std::function<void(int, int)>& progress = nullptr);

}  // namespace st

namespace st {

// The settings of a DeviationSpec by name: the `attn_deviation run` flags (--name VALUE) and
// the keys of a sweep plan's entries are these. Each has a one-line help text.
struct SpecKey {
  const char* name;
  const char* help;
};
const std::vector<SpecKey>& deviation_spec_keys();
// Sets one named setting from its text; a one-line error naming the key and the accepted
// values otherwise ("where" prefixes it, e.g. the plan file and entry).
void set_spec_field(DeviationSpec& s, const std::string& key, const std::string& value,
                    const std::string& where = "");

}  // namespace st
