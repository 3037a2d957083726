// The weight-distance library (analysis/weight_distance.h): exact W1 on hand-computed cases
// and against an independent CDF-integral formula, the weight slices' layout, the distance
// rows and their CSV line, and checkpoint weights read back in FP32 and FP64. (The `compare`
// tool end to end: test_compare_tool.cpp; their shared harness: compare_fixture.h.)
//
// Suite names start with "compare_" so that `ctest -R compare` selects them all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/slices.h"
#include "analysis/weight_distance.h"
#include "core/error.h"
#include "core/rng.h"
#include "compare_fixture.h"
#include "io/checkpoint.h"
#include "model_shapes.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace st;
using st::test::slurp;

using namespace st::compare_test;

namespace {

// ---------------------------------------------------------------- references

// W1 as the integral of |F_a(x) - F_b(x)| over x (the CDF form, as scipy computes it):
// independent of the quantile-merge formulation in weight_distance.cpp.
double w1_cdf(std::vector<double> a, std::vector<double> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<double> all = a;
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  long double sum = 0;
  for (size_t k = 0; k + 1 < all.size(); ++k) {
    const double x = all[k];
    const long double fa =
        (long double)(std::upper_bound(a.begin(), a.end(), x) - a.begin()) / a.size();
    const long double fb =
        (long double)(std::upper_bound(b.begin(), b.end(), x) - b.begin()) / b.size();
    sum += std::fabs(fa - fb) * ((long double)all[k + 1] - x);
  }
  return static_cast<double>(sum);
}

std::vector<double> random_values(Rng& r, size_t n, double scale) {
  std::vector<double> v(n);
  for (auto& x : v) x = scale * r.normal();
  return v;
}

// vocab_size 10, padded to 128: 118 padding rows.
GPT2Config small_config() { return test::gpt2_shape(2, 2, 8, 5, 10); }

// Offsets of the parameter tensors in the flat array, from param_shapes (llm.c order).
std::vector<int64_t> param_offsets(const GPT2Config& c) {
  const auto shapes = param_shapes(c);
  std::vector<int64_t> off(kNumParams + 1, 0);
  for (int id = 0; id < kNumParams; ++id) off[id + 1] = off[id] + shape_numel(shapes[id]);
  return off;
}

}  // namespace


// ---------------------------------------------------------------- W1

TEST(compare_W1, HandComputedEqualSizes) {
  // sort(b) = {1, 2, 5}: (|0-1| + |1-2| + |3-5|) / 3
  EXPECT_DOUBLE_EQ(wasserstein1({0, 1, 3}, {5, 2, 1}), 4.0 / 3.0);
  EXPECT_EQ(wasserstein1({2}, {-3}), 5.0);
  EXPECT_EQ(wasserstein1({1, 2, 3, 4}, {4, 3, 2, 1}), 0.0);  // same distribution
}

TEST(compare_W1, HandComputedUnequalSizes) {
  // Quantile pieces in units of 1/6: a = 0 on (0,3], 1 on (3,6]; b = 0, 1, 2 on
  // (0,2], (2,4], (4,6]: |0-1| on (2,3] and |1-2| on (4,6] -> (1 + 2) / 6.
  EXPECT_DOUBLE_EQ(wasserstein1({0, 1}, {0, 1, 2}), 0.5);
  // a = 1; b = 0, 4: half the mass moves 1, half moves 3.
  EXPECT_DOUBLE_EQ(wasserstein1({1}, {0, 4}), 2.0);
  // Units of 1/12: a = 0 on (0,9], 6 on (9,12]; b = 1, 2, 3 on (0,4], (4,8], (8,12]:
  // 1*4 + 2*4 + 3*1 + 3*3 = 24 -> 2.
  EXPECT_DOUBLE_EQ(wasserstein1({0, 6, 0, 0}, {3, 1, 2}), 2.0);
  // A sample and the same sample twice over are the same distribution.
  EXPECT_EQ(wasserstein1({0.5, -1, 2}, {2, 0.5, -1, -1, 2, 0.5}), 0.0);
}

TEST(compare_W1, SymmetricAndMatchesTheCdfIntegral) {
  Rng r(5);
  for (const auto& [n, m] : std::vector<std::pair<size_t, size_t>>{
           {1, 1}, {7, 7}, {50, 50}, {3, 8}, {37, 101}, {1000, 999}, {64, 4096}}) {
    const auto a = random_values(r, n, 0.02), b = random_values(r, m, 0.03);
    const double ab = wasserstein1(a, b), ba = wasserstein1(b, a);
    EXPECT_EQ(ab, ba) << n << " x " << m;
    const double ref = w1_cdf(a, b);
    EXPECT_NEAR(ab, ref, 1e-12 * ref) << n << " x " << m;
    EXPECT_GT(ab, 0);
  }
}

TEST(compare_W1, IdenticalIsZeroAndShiftGivesTheShift) {
  Rng r(6);
  auto a = random_values(r, 999, 1.0);
  EXPECT_EQ(wasserstein1(a, a), 0.0);
  auto shuffled = a;
  std::reverse(shuffled.begin(), shuffled.end());
  EXPECT_EQ(wasserstein1(a, shuffled), 0.0);
  // Values on a 2^-10 grid in [-8, 8] and c = 0.75: a + c is exact, so every |a_i - b_i| is
  // exactly 0.75 and so is the mean.
  for (double& x : a) x = std::round(std::clamp(x, -7.0, 7.0) * 1024) / 1024;
  for (const double c : {0.75, -0.75, 3.0}) {
    std::vector<double> b = a;
    for (double& x : b) x += c;
    EXPECT_EQ(wasserstein1(a, b), std::fabs(c));
    EXPECT_EQ(wasserstein1(b, a), std::fabs(c));
  }
}

TEST(compare_W1, EmptyIsAnErrorNaNGivesNaN) {
  EXPECT_THROW(wasserstein1({}, {1.0}), Error);
  EXPECT_THROW(wasserstein1({1.0}, {}), Error);
  EXPECT_TRUE(std::isnan(wasserstein1({1.0, NAN}, {1.0, 2.0})));
}

// ---------------------------------------------------------------- slices

TEST(compare_Slices, WithoutHeadsTileTheFlatArrayExceptWtePadding) {
  for (const GPT2Config& c : {small_config(), [] {
                                GPT2Config d;
                                d.n_layer = 3, d.n_head = 4, d.n_embd = 16, d.max_seq_len = 7;
                                d.vocab_size = 300;
                                return d;
                              }()}) {
    const int64_t np = num_parameters(c);
    const auto off = param_offsets(c);
    ASSERT_EQ(off[kNumParams], np);
    std::vector<int> hits(static_cast<size_t>(np), 0);
    const auto slices = weight_slices(c, false);
    // 4 unstacked tensors + 12 stacked ones per layer, in llm.c order.
    ASSERT_EQ(slices.size(), size_t(4 + 12 * c.n_layer));
    int64_t expected_offset = 0;
    for (const WeightSlice& s : slices) {
      EXPECT_EQ(s.head, -1);
      EXPECT_EQ(s.row_stride, s.cols) << slice_label(s);
      EXPECT_EQ(s.offset, expected_offset) << slice_label(s) << ": not contiguous in order";
      expected_offset = s.offset + s.numel();
      if (s.tensor == "wte") expected_offset = off[kWte + 1];  // skip the padding rows
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t k = 0; k < s.cols; ++k) ++hits[static_cast<size_t>(s.offset + r * s.row_stride + k)];
    }
    EXPECT_EQ(expected_offset, np);
    const int64_t pad_begin = int64_t(c.vocab_size) * c.n_embd, pad_end = off[kWte + 1];
    ASSERT_GT(pad_end, pad_begin) << "the config should have padding rows";
    for (int64_t i = 0; i < np; ++i) {
      const int want = (i >= pad_begin && i < pad_end) ? 0 : 1;
      ASSERT_EQ(hits[static_cast<size_t>(i)], want) << "element " << i;
    }
    // The names of the documented table, per layer for the stacked tensors.
    EXPECT_EQ(slices.front().tensor, "wte");
    EXPECT_EQ(slices.front().rows, c.vocab_size);
    EXPECT_EQ(slices[1].tensor, "wpe");
    EXPECT_EQ(slices[1].rows, c.max_seq_len);
    EXPECT_EQ(slices.back().tensor, "lnfb");
    EXPECT_EQ(slices[2].tensor, "ln1w");
    EXPECT_EQ(slices[2].layer, 0);
    EXPECT_EQ(slices[2 + c.n_layer].tensor, "ln1b");
  }
}

TEST(compare_Slices, PerHeadSlicesLandOnTheDocumentedRowsAndColumns) {
  const GPT2Config c = small_config();
  const int64_t C = c.n_embd, NH = c.n_head, hs = C / NH, np = num_parameters(c);
  const auto off = param_offsets(c);
  std::vector<double> flat(static_cast<size_t>(np));
  std::iota(flat.begin(), flat.end(), 0.0);  // value = flat index
  const auto slices = weight_slices(c, true);
  int n_heads_seen = 0;
  std::vector<int> qkv_hits(static_cast<size_t>(np), 0), wo_hits(static_cast<size_t>(np), 0);
  for (const WeightSlice& s : slices) {
    if (s.head < 0) continue;
    ++n_heads_seen;
    const auto v = s.gather(flat.data());
    ASSERT_EQ(v.size(), size_t(hs * C)) << slice_label(s);
    const int64_t l = s.layer, h = s.head;
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t k = 0; k < s.cols; ++k) {
        int64_t want;
        if (s.tensor == "wo") {
          // attprojw[l] is (C out, C in); head h's output feeds input columns [h*hs, (h+1)*hs).
          ASSERT_EQ(s.rows, C);
          ASSERT_EQ(s.cols, hs);
          want = off[kAttprojw] + l * C * C + r * C + (h * hs + k);
          ++wo_hits[static_cast<size_t>(want)];
        } else {
          const int which = s.tensor == "wq" ? 0 : s.tensor == "wk" ? 1 : 2;
          ASSERT_TRUE(s.tensor == "wq" || s.tensor == "wk" || s.tensor == "wv") << s.tensor;
          ASSERT_EQ(s.rows, hs);
          ASSERT_EQ(s.cols, C);
          // qkvw[l] is (3C, C): rows [which*C + h*hs, ... + hs).
          want = off[kQkvw] + l * 3 * C * C + (which * C + h * hs + r) * C + k;
          ++qkv_hits[static_cast<size_t>(want)];
        }
        ASSERT_EQ(v[static_cast<size_t>(r * s.cols + k)], double(want))
            << slice_label(s) << " (" << r << ", " << k << ")";
      }
    EXPECT_EQ(slice_label(s), s.tensor + " L" + std::to_string(l) + " H" + std::to_string(h));
  }
  EXPECT_EQ(n_heads_seen, 4 * NH * c.n_layer);
  // Together the heads cover qkvw and attprojw exactly once.
  for (int64_t i = 0; i < np; ++i) {
    const bool in_qkvw = i >= off[kQkvw] && i < off[kQkvw + 1];
    const bool in_attprojw = i >= off[kAttprojw] && i < off[kAttprojw + 1];
    ASSERT_EQ(qkv_hits[static_cast<size_t>(i)], in_qkvw ? 1 : 0) << i;
    ASSERT_EQ(wo_hits[static_cast<size_t>(i)], in_attprojw ? 1 : 0) << i;
  }
}

// ---------------------------------------------------------------- weight_distances

TEST(compare_Distances, RowsFollowTheSlicesAndLocalizeAChange) {
  const GPT2Config c = small_config();
  const int64_t np = num_parameters(c);
  Rng r(11);
  std::vector<float> a(static_cast<size_t>(np));
  for (auto& x : a) x = static_cast<float>(0.02 * r.normal());
  const auto same = weight_distances(c, a, a);
  const auto slices = weight_slices(c, true);
  ASSERT_EQ(same.size(), slices.size());
  for (size_t i = 0; i < same.size(); ++i) {
    EXPECT_EQ(same[i].tensor, slices[i].tensor);
    EXPECT_EQ(same[i].layer, slices[i].layer);
    EXPECT_EQ(same[i].head, slices[i].head);
    EXPECT_EQ(same[i].w1, 0.0);
    EXPECT_EQ(same[i].w1_normalized, 0.0);
    EXPECT_EQ(same[i].max_abs_diff, 0.0);
  }
  // Change one element of layer 1's W_K, head 1, row 2, column 3.
  const auto off = param_offsets(c);
  const int64_t C = c.n_embd, hs = C / c.n_head;
  const int64_t at = off[kQkvw] + 1 * 3 * C * C + (C + 1 * hs + 2) * C + 3;
  std::vector<float> b = a;
  b[static_cast<size_t>(at)] += 0.5f;
  const double delta = double(b[static_cast<size_t>(at)]) - double(a[static_cast<size_t>(at)]);
  const auto rows = weight_distances(c, a, b);
  for (size_t i = 0; i < rows.size(); ++i) {
    const WeightSlice& s = slices[i];
    const bool holds = (s.tensor == "qkvw" && s.layer == 1) ||
                       (s.tensor == "wk" && s.layer == 1 && s.head == 1);
    EXPECT_EQ(rows[i].max_abs_diff, holds ? delta : 0.0) << slice_label(s);
    const auto va = s.gather(a.data()), vb = s.gather(b.data());
    EXPECT_EQ(rows[i].w1, wasserstein1(va, vb)) << slice_label(s);
    double mean_abs = 0;
    for (double x : va) mean_abs += std::fabs(x);
    mean_abs /= double(va.size());
    EXPECT_NEAR(rows[i].w1_normalized, rows[i].w1 / mean_abs, 1e-12 * rows[i].w1 / mean_abs);
    if (holds) {
      EXPECT_GT(rows[i].w1, 0) << slice_label(s);
    }
  }
  // Layernorm gains of 1 in A, 1.5 in B: w1 0.5, normalized by mean |A| = 1.
  std::vector<float> g = a, g2 = a;
  for (int64_t i = off[kLnfw]; i < off[kLnfw + 1]; ++i) {
    g[static_cast<size_t>(i)] = 1.0f;
    g2[static_cast<size_t>(i)] = 1.5f;
  }
  for (const auto& row : weight_distances(c, g, g2))
    if (row.tensor == "lnfw") {
      EXPECT_EQ(row.w1, 0.5);
      EXPECT_EQ(row.w1_normalized, 0.5);
      EXPECT_EQ(row.max_abs_diff, 0.5);
    }
  // Wrong sizes are refused.
  std::vector<float> short_b(b.begin(), b.end() - 1);
  EXPECT_THROW(weight_distances(c, a, short_b), Error);
}

TEST(compare_Distances, CsvLineIsShortestRoundTripWithMinusOneLayerAndHead) {
  EXPECT_STREQ(kDistanceCsvHeader, "step,tensor,layer,head,w1,w1_normalized,max_abs_diff");
  DistanceRow r;
  r.tensor = "wte";
  r.w1 = 0.1;
  r.w1_normalized = 1.0 / 3.0;
  r.max_abs_diff = 2.5e-8;
  EXPECT_EQ(distance_csv_line(400, r), "400,wte,-1,-1,0.1,0.3333333333333333,2.5e-08");
  r.tensor = "wq";
  r.layer = 3;
  r.head = 0;
  r.w1 = 0;
  const std::string line = distance_csv_line(7, r);
  EXPECT_EQ(line, "7,wq,3,0,0,0.3333333333333333,2.5e-08");
  EXPECT_EQ(std::stod(split(line)[5]), 1.0 / 3.0);  // reads back exactly
}

TEST(compare_Distances, LoadCheckpointWeightsFp32Fp64AndSizeCheck) {
  const GPT2Config c = small_config();
  const int64_t np = num_parameters(c);
  CheckpointState s;
  s.step = 40;
  set_model_config(s, c);
  s.compute = "fp64";
  Rng r(3);
  std::vector<double> d(static_cast<size_t>(np));
  for (auto& x : d) x = 0.02 * r.normal();
  s.master_elem_bytes = 8;
  s.master.resize(d.size() * 8);
  std::memcpy(s.master.data(), d.data(), s.master.size());
  s.m = s.v = s.master;
  const std::string p64 = (tmp_root() / "w64.bin").string();
  save_checkpoint(p64, s);
  const CheckpointWeights w = load_checkpoint_weights(p64);
  EXPECT_EQ(w.step, 40);
  EXPECT_EQ(w.config.n_layer, c.n_layer);
  EXPECT_EQ(w.config.n_head, c.n_head);
  EXPECT_EQ(w.config.n_embd, c.n_embd);
  EXPECT_EQ(w.config.max_seq_len, c.max_seq_len);
  EXPECT_EQ(w.config.vocab_size, c.vocab_size);
  EXPECT_EQ(w.config.vp(), c.vp());
  ASSERT_EQ(w.master.size(), d.size());
  for (size_t i = 0; i < d.size(); ++i) ASSERT_EQ(w.master[i], static_cast<float>(d[i])) << i;

  // FP32 master: the same floats back.
  std::vector<float> f(w.master);
  s.master_elem_bytes = 4;
  s.master.resize(f.size() * 4);
  std::memcpy(s.master.data(), f.data(), s.master.size());
  s.m = s.v = s.master;
  const std::string p32 = (tmp_root() / "w32.bin").string();
  save_checkpoint(p32, s);
  EXPECT_EQ(load_checkpoint_weights(p32).master, f);

  // A master array that does not fit the recorded shape: the error names the file.
  s.n_layer = 3;
  const std::string bad = (tmp_root() / "w_bad_shape.bin").string();
  save_checkpoint(bad, s);
  try {
    load_checkpoint_weights(bad);
    ADD_FAILURE() << "a master size that does not match the shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parameters"), std::string::npos) << e.what();
  }
}
