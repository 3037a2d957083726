// Internal to the stability hooks (train/hooks.cpp, hooks_spectral.cpp, hooks_drift.cpp):
// the helpers more than one of them needs. Not part of the public header train/hooks.h.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace st::detail {

inline double norm2(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

constexpr int64_t kParallelNumel = int64_t(1) << 18;  // slices this big split their matvecs

}  // namespace st::detail
