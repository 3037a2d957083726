// Weight distances between two runs (analysis/weight_distance.h): exact 1-D Wasserstein
// distance, max |a - b| and the normalized W1 per weight slice, the master weights of a
// checkpoint, and the CSV line shared by `compare` and the hooks.
//
// W1 of two empirical distributions is the L1 distance of their quantile functions,
//   W1(a, b) = integral over u in (0, 1) of |F_a^{-1}(u) - F_b^{-1}(u)| du.
// With a and b sorted, F_a^{-1} is the step function equal to a[i] on (i/n, (i+1)/n]. For
// equal sizes the pieces coincide and W1 = mean |a[i] - b[i]|. For unequal sizes the two
// step functions are merged: the breakpoints i/n and j/m, both multiples of 1/(n*m), are
// compared as the integers i*m and j*n, so every piece's length is an exact integer count
// of 1/(n*m) units (n*m < 2^53 for any slice we hold in memory); the sum is taken in FP64
// with compensated (Neumaier) summation and divided by n*m once.
#include "analysis/weight_distance.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/weights.h"

namespace st {
namespace {

// Neumaier's compensated sum: the result is the correctly rounded sum for all practical
// purposes (error independent of the number of terms).
class Sum {
 public:
  void add(double x) {
    const double t = s_ + x;
    if (std::fabs(s_) >= std::fabs(x))
      c_ += (s_ - t) + x;
    else
      c_ += (x - t) + s_;
    s_ = t;
  }
  double value() const { return s_ + c_; }

 private:
  double s_ = 0, c_ = 0;
};

bool has_nan(const std::vector<double>& v) {
  for (double x : v)
    if (std::isnan(x)) return true;
  return false;
}

void put_double(std::string& out, double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void put_int(std::string& out, int64_t v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

}  // namespace

double wasserstein1(std::vector<double> a, std::vector<double> b) {
  if (a.empty() || b.empty())
    fail("wasserstein1: empty sample (sizes ", a.size(), " and ", b.size(), "; both must be > 0)");
  // NaN has no place in an order: the distance is undefined (and std::sort would be UB).
  if (has_nan(a) || has_nan(b)) return std::numeric_limits<double>::quiet_NaN();
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  const uint64_t n = a.size(), m = b.size();
  Sum s;
  if (n == m) {
    for (uint64_t i = 0; i < n; ++i) s.add(std::fabs(a[i] - b[i]));
    return s.value() / static_cast<double>(n);
  }
  ST_CHECK(static_cast<double>(n) * static_cast<double>(m) < 9007199254740992.0,
           "sample sizes ", n, " x ", m, " too large for exact quantile pieces (< 2^53)");
  // Pieces in units of 1/(n*m): a[i] covers (i*m, (i+1)*m], b[j] covers (j*n, (j+1)*n].
  uint64_t i = 0, j = 0, pos = 0;
  while (i < n && j < m) {
    const uint64_t end_a = (i + 1) * m, end_b = (j + 1) * n;
    const uint64_t end = std::min(end_a, end_b);
    s.add(std::fabs(a[i] - b[j]) * static_cast<double>(end - pos));
    pos = end;
    if (end_a == end) ++i;
    if (end_b == end) ++j;
  }
  return s.value() / (static_cast<double>(n) * static_cast<double>(m));
}

std::vector<DistanceRow> weight_distances(const GPT2Config& c, const std::vector<float>& a,
                                          const std::vector<float>& b) {
  const int64_t np = num_parameters(c);
  if (static_cast<int64_t>(a.size()) != np || static_cast<int64_t>(b.size()) != np)
    fail("weight_distances: parameter arrays hold ", a.size(), " and ", b.size(),
         " values; the model (n_layer ", c.n_layer, ", n_head ", c.n_head, ", n_embd ", c.n_embd,
         ", max_seq_len ", c.max_seq_len, ", vocab ", c.vp(), ") has ", np);
  // Slices are independent: one per OpenMP task, each with its own ordered sums, so the
  // result does not depend on the thread count.
  const std::vector<WeightSlice> slices = weight_slices(c, true);
  std::vector<DistanceRow> rows(slices.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < static_cast<int64_t>(slices.size()); ++i) {
    const WeightSlice& s = slices[static_cast<size_t>(i)];
    std::vector<double> va = s.gather(a.data()), vb = s.gather(b.data());
    DistanceRow& r = rows[static_cast<size_t>(i)];
    r.tensor = s.tensor;
    r.layer = s.layer;
    r.head = s.head;
    double mx = 0;
    Sum abs_a;
    bool nan = false;
    for (size_t k = 0; k < va.size(); ++k) {
      const double d = std::fabs(va[k] - vb[k]);
      if (std::isnan(d)) nan = true;
      mx = std::max(mx, d);
      abs_a.add(std::fabs(va[k]));
    }
    const double nanv = std::numeric_limits<double>::quiet_NaN();
    r.max_abs_diff = nan ? nanv : mx;
    if (va.empty()) continue;  // no such slice in a valid config; all distances stay 0
    const double mean_abs = abs_a.value() / static_cast<double>(va.size());
    // Equal, non-zero sizes: wasserstein1 cannot throw here (no exception leaves the loop).
    r.w1 = wasserstein1(std::move(va), std::move(vb));
    r.w1_normalized = std::isnan(mean_abs) ? nanv : mean_abs > 0 ? r.w1 / mean_abs : 0.0;
  }
  return rows;
}

CheckpointWeights load_checkpoint_weights(const std::string& path) {
  const CheckpointState s = load_checkpoint(path);
  ModelWeights m = weights_from_checkpoint(s, path);
  CheckpointWeights w;
  w.config = m.config;
  w.step = s.step;
  w.master = std::move(m.params);
  return w;
}

const char* const kDistanceCsvHeader = "step,tensor,layer,head,w1,w1_normalized,max_abs_diff";

std::string distance_csv_line(int64_t step, const DistanceRow& r) {
  std::string out;
  put_int(out, step);
  out += ',';
  out += r.tensor;
  out += ',';
  put_int(out, r.layer < 0 ? -1 : r.layer);  // -1: not per layer (an integer column)
  out += ',';
  put_int(out, r.head < 0 ? -1 : r.head);
  out += ',';
  put_double(out, r.w1);
  out += ',';
  put_double(out, r.w1_normalized);
  out += ',';
  put_double(out, r.max_abs_diff);
  return out;
}

int64_t nearest_step(const std::map<int64_t, std::string>& have, int64_t step, int64_t max_gap) {
  if (have.empty()) return -1;
  const auto hi = have.lower_bound(step);  // first >= step
  int64_t best = -1;
  if (hi != have.end()) best = hi->first;
  if (hi != have.begin()) {
    const int64_t lo = std::prev(hi)->first;
    if (best < 0 || step - lo <= best - step) best = lo;  // a tie goes to the earlier step
  }
  const int64_t gap = best > step ? best - step : step - best;
  return max_gap >= 0 && gap > max_gap ? -1 : best;
}

}  // namespace st
