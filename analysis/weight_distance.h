// Distances between the weights of two runs (Golden et al.'s training-side metrics), one
// implementation for `compare`, the hooks.reference_run hook and `report`.
//   max_abs_diff  max_i |a_i - b_i| over the slice (element by element: same shapes only)
//   w1            1-D Wasserstein distance between the two empirical distributions of the
//                 slice's values, exact: for equal sizes the mean of |sort(a) - sort(b)|
//                 (computed in FP64 from the FP32 master weights)
//   w1_normalized w1 / mean(|a|) (run A's mean absolute weight; 0 when that mean is 0), so
//                 slices of different scale (layernorm gains ~1, projections ~0.02) can be
//                 compared on one axis
// Rows come per slice of analysis/slices.h: every tensor (per layer), plus per head for
// the attention weights (wq, wk, wv, wo).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/slices.h"

namespace st {

double wasserstein1(std::vector<double> a, std::vector<double> b);  // exact; any sizes > 0

struct DistanceRow {
  std::string tensor;
  int layer = -1, head = -1;  // -1: not per layer / not per head (-1 in CSV files too)
  double w1 = 0, w1_normalized = 0, max_abs_diff = 0;
};

// a, b: flat parameter arrays of num_parameters(c) values (FP32 master weights).
std::vector<DistanceRow> weight_distances(const GPT2Config& c, const std::vector<float>& a,
                                          const std::vector<float>& b);

// The FP32 master weights and model shape stored in a checkpoint (load_checkpoint's
// checks apply: errors name the file). FP64-mode checkpoints are converted to FP32.
struct CheckpointWeights {
  GPT2Config config;
  int64_t step = 0;
  std::vector<float> master;
};
CheckpointWeights load_checkpoint_weights(const std::string& path);

// The checkpoint step of `have` (step -> file) nearest to `step` (the earlier one on a
// tie), or -1 when `have` is empty or the nearest is more than max_gap away (max_gap < 0:
// any distance). How `compare` and `report` pair two runs' checkpoints: each of run A's
// steps with run B's checkpoint of the same step, else B's nearest.
int64_t nearest_step(const std::map<int64_t, std::string>& have, int64_t step, int64_t max_gap);

// CSV header and one line per row: "step,tensor,layer,head,w1,w1_normalized,max_abs_diff"
// (the hooks' wasserstein.csv). Numbers are written as shortest round-trip decimals;
// layer/head are -1 when not per layer / head (as in compare.csv; not empty, so pandas reads
// the columns as integers). Neither the header nor the line ends in a newline.
extern const char* const kDistanceCsvHeader;
std::string distance_csv_line(int64_t step, const DistanceRow& r);

}  // namespace st
