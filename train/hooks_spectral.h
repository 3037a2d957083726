// The hooks' power iteration (implemented in train/hooks_spectral.cpp; included by
// train/hooks.h): the largest singular value of a weight slice.
#pragma once
#include <cstdint>
#include <vector>

#include "analysis/slices.h"

namespace st {

// Largest singular value of a slice of `flat` by power iteration on A^T A, starting from
// `v` (resized and seeded deterministically when empty or of the wrong size) and leaving
// the final right singular vector estimate in it. Stops when the relative residual
// ||A^T A v - rho v|| / rho is at most tol or after max_iters iterations. A cold start (v
// empty) of a matrix with a short side <= 512 first iterates on the small Gram matrix
// (A^T A or A A^T), which costs one pass over A instead of hundreds; its iterations count
// towards max_iters and iters. FP64 arithmetic; the result does not
// depend on the number of threads.
struct PowerResult {
  double sigma = 0;
  int iters = 0;
  bool converged = false;
};
PowerResult spectral_norm(const WeightSlice& s, const float* flat, std::vector<double>& v,
                          double tol, int max_iters, uint64_t seed = 0);

}  // namespace st
