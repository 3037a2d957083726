// Reductions over whole tensors. Fixed chunks of 64K elements are summed in FP64, each in
// element order, and the chunk sums added in order: the result does not depend on the
// thread count (and model/gpt2.h's sharded gradient norm adds the same chunk sums).
#include <cmath>
#include <vector>

#include "layers/cpu_kernels.h"

namespace st::cpu {
namespace {
constexpr size_t kChunk = 1 << 16;
}

template <class T>
double sum_squares(const T* x, size_t n) {
  const size_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(nchunks);
  // Each chunk's sum is one sequential FP64 chain, and its latency bounds the loop. Groups of
  // kLanes whole chunks run their chains side by side (lane k: chunk g*kLanes + k, in element
  // order), which gives every chunk the bits of its own sequential loop, kLanes times faster.
  constexpr size_t kLanes = 8;
  const size_t groups = (n / kChunk) / kLanes;
#pragma omp parallel for schedule(static)
  for (size_t g = 0; g < groups; ++g) {
    const T* base = x + g * kLanes * kChunk;
    double s[kLanes] = {};
    for (size_t i = 0; i < kChunk; ++i)
      for (size_t k = 0; k < kLanes; ++k) {
        const double v = static_cast<double>(base[k * kChunk + i]);
        s[k] += v * v;
      }
    for (size_t k = 0; k < kLanes; ++k) part[g * kLanes + k] = s[k];
  }
#pragma omp parallel for schedule(static)
  for (size_t c = groups * kLanes; c < nchunks; ++c) {
    const size_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
    double s = 0;
    for (size_t i = i0; i < i1; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    part[c] = s;
  }
  double total = 0;
  for (double p : part) total += p;
  return total;
}

template <class T>
bool all_finite(const T* x, size_t n) {
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (size_t i = 0; i < n; ++i) bad |= !std::isfinite(x[i]);
  return !bad;
}

template double sum_squares<float>(const float*, size_t);
template double sum_squares<double>(const double*, size_t);
template bool all_finite<float>(const float*, size_t);
template bool all_finite<double>(const double*, size_t);

}  // namespace st::cpu
