// Fused classifier: softmax cross-entropy over the first V of Vp logit columns, in T
// (FP32) from stored (possibly BF16) logits. Loss = log(sum exp(x - max)) - (x_t - max).
// dlogits = round((p - onehot) * dloss), 0 in padded columns; may overwrite the logits.
// The exponentials are computed once per row into the output row (or a scratch row),
// vectorised for FP32 (layers/vec_math.h), then summed in column order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "layers/cpu_kernels.h"
#include "layers/vec_math.h"

namespace st::cpu {
namespace {
inline float exp_t(float x) { return exp_f32(x); }
inline double exp_t(double x) { return std::exp(x); }

// max over x[0..n) (NaNs skipped, as `x > m ? x : m` skips them), in 8 lanes so that it
// vectorises; a maximum does not depend on the order it is taken in.
template <class T>
T row_max(const T* x, int n) {
  constexpr int kLanes = 8;
  T m[kLanes];
  for (int k = 0; k < kLanes; ++k) m[k] = x[0];
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) m[k] = x[j + k] > m[k] ? x[j + k] : m[k];
  for (; j < n; ++j) m[0] = x[j] > m[0] ? x[j] : m[0];
  T r = m[0];
  for (int k = 1; k < kLanes; ++k) r = m[k] > r ? m[k] : r;
  return r;
}
}  // namespace

// Rows go in groups of kRows: each row's exponentials are summed in column order, as one
// dependent chain of adds, but the group's chains run side by side, so the adds' latency
// overlaps (one chain alone is latency-bound: 50,257 adds per GPT-2 row). Every row's sum
// is the same sequence of roundings as a row summed alone.
constexpr int kRows = 4;

template <class T>
void crossentropy_forward_backward(T* losses, T* dlogits, const T* logits,
                                   const int32_t* targets, int N, int V, int Vp, float dloss,
                                   DType fmt) {
  const int groups = (N + kRows - 1) / kRows;
#pragma omp parallel
  {
    std::vector<T> scratch(dlogits ? 0 : static_cast<size_t>(kRows) * V);
#pragma omp for schedule(static)
    for (int g = 0; g < groups; ++g) {
      const int i0 = g * kRows, nr = std::min(kRows, N - i0);
      T* e[kRows] = {};
      T mx[kRows] = {}, sum[kRows] = {};
      for (int r = 0; r < nr; ++r) {
        const int i = i0 + r;
        const T* x = logits + static_cast<size_t>(i) * Vp;
        e[r] = dlogits ? dlogits + static_cast<size_t>(i) * Vp
                       : scratch.data() + static_cast<size_t>(r) * V;  // may be x
        mx[r] = row_max(x, V);
        losses[i] = x[targets[i]] - mx[r];  // x_t - max, before e overwrites x
        for (int j = 0; j < V; ++j) e[r][j] = exp_t(x[j] - mx[r]);
      }
      if (nr == kRows) {
        for (int j = 0; j < V; ++j)
          for (int r = 0; r < kRows; ++r) sum[r] += e[r][j];
      } else {
        for (int r = 0; r < nr; ++r)
          for (int j = 0; j < V; ++j) sum[r] += e[r][j];
      }
      for (int r = 0; r < nr; ++r) {
        const int i = i0 + r, t = targets[i];
        losses[i] = std::log(sum[r]) - losses[i];
        if (!dlogits) continue;
        T* er = e[r];
        const T inv = T(1) / sum[r], pt = er[t] * inv;
        store_rounded(fmt, er, static_cast<size_t>(V), false,
                      [&](size_t j) { return er[j] * inv * T(dloss); });
        er[t] = round_to(fmt, (pt - T(1)) * T(dloss));
        for (int j = V; j < Vp; ++j) er[j] = 0;
      }
    }
  }
}

template void crossentropy_forward_backward<float>(float*, float*, const float*, const int32_t*,
                                                   int, int, int, float, DType);
template void crossentropy_forward_backward<double>(double*, double*, const double*,
                                                    const int32_t*, int, int, int, float, DType);

}  // namespace st::cpu
