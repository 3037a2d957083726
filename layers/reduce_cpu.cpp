// Reductions over whole tensors. Fixed chunks of 64K elements are summed in FP64, and the
// chunk sums added in order: the result does not depend on the thread count.
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
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < nchunks; ++c) {
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
