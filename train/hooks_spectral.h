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
// (A^T A or A A^T), which costs one pass over A instead of hundreds; a wider one (GPT-2
// small's 768 x 768 and up, wte included) starts with restarted Lanczos on A^T A (cycles of
// 32 steps, full reorthogonalisation) to a Ritz residual of tol / 2, tens of passes over A
// instead of hundreds of power iterations. Either start's iterations count towards
// max_iters and iters, and the result is accepted only by the power iteration's own
// residual test: converged means ||A^T A v - rho v|| <= tol rho, so sigma is within
// tol / 2 (relative) of a singular value (the largest, from a random start, with
// probability 1). FP64 arithmetic; the result does not depend on the number of threads.
struct PowerResult {
  double sigma = 0;
  int iters = 0;
  bool converged = false;
};
PowerResult spectral_norm(const WeightSlice& s, const float* flat, std::vector<double>& v,
                          double tol, int max_iters, uint64_t seed = 0);

}  // namespace st
