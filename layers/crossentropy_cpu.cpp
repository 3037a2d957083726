// Fused classifier: softmax cross-entropy over the first V of Vp logit columns, in T
// (FP32) from stored (possibly BF16) logits. Loss = log(sum exp(x - max)) - (x_t - max).
// dlogits = round((p - onehot) * dloss), 0 in padded columns; may overwrite the logits.
// The exponentials are computed once per row into the output row (or a scratch row),
// vectorised for FP32 (layers/vec_math.h), then summed in column order.
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

template <class T>
void crossentropy_forward_backward(T* losses, T* dlogits, const T* logits,
                                   const int32_t* targets, int N, int V, int Vp, float dloss,
                                   DType fmt) {
#pragma omp parallel
  {
    std::vector<T> scratch(dlogits ? 0 : static_cast<size_t>(V));
#pragma omp for schedule(static)
    for (int i = 0; i < N; ++i) {
      const T* x = logits + static_cast<size_t>(i) * Vp;
      T* e = dlogits ? dlogits + static_cast<size_t>(i) * Vp : scratch.data();  // may be x
      const T mx = row_max(x, V);
      const int t = targets[i];
      const T xt = x[t];
      for (int j = 0; j < V; ++j) e[j] = exp_t(x[j] - mx);
      T sum = 0;
      for (int j = 0; j < V; ++j) sum += e[j];
      losses[i] = std::log(sum) - (xt - mx);
      if (!dlogits) continue;
      const T inv = T(1) / sum, pt = e[t] * inv;
      store_rounded(fmt, e, static_cast<size_t>(V), false,
                    [&](size_t j) { return e[j] * inv * T(dloss); });
      e[t] = round_to(fmt, (pt - T(1)) * T(dloss));
      for (int j = V; j < Vp; ++j) e[j] = 0;
    }
  }
}

template void crossentropy_forward_backward<float>(float*, float*, const float*, const int32_t*,
                                                   int, int, int, float, DType);
template void crossentropy_forward_backward<double>(double*, double*, const double*,
                                                    const int32_t*, int, int, int, float, DType);

}  // namespace st::cpu
