// Token + position embedding. Forward: out = round(wte[tok] + wpe[t]).
// Backward: each token's rows of dout are summed in FP32 in (b, t) order and added to
// dwte once (round(dwte + sum)), as a deterministic GPU kernel does; dwpe likewise over b.
#include <algorithm>
#include <numeric>
#include <vector>

#include "layers/cpu_kernels.h"

namespace st::cpu {

template <class T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                     int C, DType fmt) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T_; ++bt) {
    const T* e = wte + static_cast<size_t>(tokens[bt]) * C;
    const T* p = wpe + static_cast<size_t>(bt % T_) * C;
    T* o = out + static_cast<size_t>(bt) * C;
    for (int c = 0; c < C; ++c) o[c] = round_to(fmt, e[c] + p[c]);
  }
}

template <class T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_,
                      int C, DType fmt) {
  const int n = B * T_;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return tokens[a] < tokens[b]; });
  std::vector<int> starts;  // start of each token's run in `order`
  for (int i = 0; i < n; ++i)
    if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) starts.push_back(i);
  starts.push_back(n);
  const int groups = static_cast<int>(starts.size()) - 1;
#pragma omp parallel
  {
    std::vector<T> acc(C);
#pragma omp for schedule(static)
    for (int g = 0; g < groups; ++g) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int i = starts[g]; i < starts[g + 1]; ++i) {
        const T* d = dout + static_cast<size_t>(order[i]) * C;
        for (int c = 0; c < C; ++c) acc[c] += d[c];
      }
      T* w = dwte + static_cast<size_t>(tokens[order[starts[g]]]) * C;
      for (int c = 0; c < C; ++c) w[c] = round_to(fmt, w[c] + acc[c]);
    }
#pragma omp for schedule(static)
    for (int t = 0; t < T_; ++t) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int b = 0; b < B; ++b) {
        const T* d = dout + (static_cast<size_t>(b) * T_ + t) * C;
        for (int c = 0; c < C; ++c) acc[c] += d[c];
      }
      T* w = dwpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) w[c] = round_to(fmt, w[c] + acc[c]);
    }
  }
}

#define INSTANTIATE(T)                                                                    \
  template void encoder_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int, \
                                   DType);                                                \
  template void encoder_backward<T>(T*, T*, const T*, const int32_t*, int, int, int, DType);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace st::cpu
