// Fused classifier: softmax cross-entropy over the first V of Vp logit columns, in T
// (FP32) from stored (possibly BF16) logits. Loss = log(sum exp(x - max)) - (x_t - max).
// dlogits = round((p - onehot) * dloss), 0 in padded columns; may overwrite the logits.
#include <cmath>

#include "layers/cpu_kernels.h"

namespace st::cpu {

template <class T>
void crossentropy_forward_backward(T* losses, T* dlogits, const T* logits,
                                   const int32_t* targets, int N, int V, int Vp, float dloss,
                                   DType fmt) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* x = logits + static_cast<size_t>(i) * Vp;
    T mx = x[0];
    for (int j = 1; j < V; ++j) mx = x[j] > mx ? x[j] : mx;
    T sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(x[j] - mx);
    const int t = targets[i];
    losses[i] = std::log(sum) - (x[t] - mx);
    if (!dlogits) continue;
    T* d = dlogits + static_cast<size_t>(i) * Vp;
    const T inv = T(1) / sum;
    for (int j = 0; j < V; ++j) {
      const T p = std::exp(x[j] - mx) * inv;
      d[j] = round_to(fmt, (p - (j == t ? T(1) : T(0))) * T(dloss));
    }
    for (int j = V; j < Vp; ++j) d[j] = 0;
  }
}

template void crossentropy_forward_backward<float>(float*, float*, const float*, const int32_t*,
                                                   int, int, int, float, DType);
template void crossentropy_forward_backward<double>(double*, double*, const double*,
                                                    const int32_t*, int, int, int, float, DType);

}  // namespace st::cpu
