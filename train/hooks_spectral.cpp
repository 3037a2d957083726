// Spectral norms for the stability hooks (spectral_norm, train/hooks_spectral.h): power
// iteration on A^T A of a weight slice, warm-started from the previous hook's vector, with a
// cold start on the small Gram matrix for thin matrices. FP64; results do not depend on threads.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "train/hooks_spectral.h"
#include "train/hooks_internal.h"

namespace st {

using detail::kParallelNumel;
using detail::norm2;

// ---------------------------------------------------------------------------------------
// Power iteration

namespace {

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

namespace {

constexpr int64_t kGramMaxSide = 512;  // cold starts of thinner matrices use the Gram matrix

// Power iteration on the k x k Gram matrix of A's short side (G = A^T A when n <= m, else
// A A^T), FP64, to the same residual tolerance; leaves in v (length n, unnormalised) the
// start vector for the iteration on A. Returns the iterations used.
int gram_start(const float* A, int64_t ld, int64_t m, int64_t n, std::vector<double>& v,
               double tol, int max_iters, bool par) {
  const bool cols = n <= m;  // G = A^T A (n x n) or A A^T (m x m)
  const int64_t k = cols ? n : m, len = cols ? m : n;
  std::vector<double> G(static_cast<size_t>(k * k), 0.0);
  // G[i][j] = sum over the long side of a_i a_j, each entry summed in index order.
#pragma omp parallel for schedule(dynamic) if (par)
  for (int64_t i = 0; i < k; ++i) {
    std::vector<double> acc(static_cast<size_t>(k - i), 0.0);
    for (int64_t t = 0; t < len; ++t) {
      const double ai = cols ? A[t * ld + i] : A[i * ld + t];
      if (ai == 0) continue;
      for (int64_t j = i; j < k; ++j) acc[j - i] += ai * (cols ? A[t * ld + j] : A[j * ld + t]);
    }
    for (int64_t j = i; j < k; ++j) G[i * k + j] = G[j * k + i] = acc[j - i];
  }
  std::vector<double> x(static_cast<size_t>(k)), y(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {  // the random v, or A v for the left side
    if (cols) {
      x[i] = v[i];
    } else {
      double a = 0;
      for (int64_t j = 0; j < n; ++j) a += A[i * ld + j] * v[j];
      x[i] = a;
    }
  }
  double nx = norm2(x);
  for (auto& e : x) e /= nx;
  int it = 0;
  while (it < max_iters) {
    ++it;
    double rho = 0;
    for (int64_t i = 0; i < k; ++i) {
      double a = 0;
      for (int64_t j = 0; j < k; ++j) a += G[i * k + j] * x[j];
      y[i] = a;
      rho += x[i] * a;
    }
    double res = 0;
    for (int64_t i = 0; i < k; ++i) res += (y[i] - rho * x[i]) * (y[i] - rho * x[i]);
    const double ny = norm2(y);
    if (ny == 0) break;
    for (int64_t i = 0; i < k; ++i) x[i] = y[i] / ny;
    if (std::sqrt(res) <= tol * rho) break;
  }
  if (cols) {
    v = x;
  } else {  // right vector from the left one: v = A^T x
    for (int64_t j = 0; j < n; ++j) {
      double a = 0;
      for (int64_t i = 0; i < m; ++i) a += A[i * ld + j] * x[i];
      v[j] = a;
    }
  }
  return it;
}

}  // namespace

PowerResult spectral_norm(const WeightSlice& s, const float* flat, std::vector<double>& v,
                          double tol, int max_iters, uint64_t seed) {
  const int64_t m = s.rows, n = s.cols;
  ST_CHECK(m > 0 && n > 0, "spectral_norm: empty slice ", slice_label(s));
  const bool par = m * n >= kParallelNumel;
  const float* A = flat + s.offset;
  const int64_t ld = s.row_stride;
  PowerResult r;
  if (static_cast<int64_t>(v.size()) != n || norm2(v) == 0) {
    // Cold start. Random weights have clustered top singular values, so power iteration
    // on A needs hundreds of iterations; for a thin matrix, iterate on the small Gram
    // matrix (A^T A or A A^T, k x k, k = min(m, n)) instead and start from its result.
    v.assign(static_cast<size_t>(n), 0.0);
    uint64_t x = seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(s.offset);
    for (auto& e : v) e = static_cast<double>(splitmix(x) >> 11) * 0x1p-53 * 2.0 - 1.0;
    const int64_t k = std::min(m, n);
    if (k <= kGramMaxSide && k > 1 && max_iters > 1)
      r.iters = gram_start(A, ld, m, n, v, tol, max_iters - 1, par);
  }
  {
    const double nv = norm2(v);
    for (auto& e : v) e /= nv;
  }
  std::vector<double> u(static_cast<size_t>(m)), w(static_cast<size_t>(n));
  const int first = r.iters;
  for (int it = first + 1; it <= max_iters; ++it) {  // max_iters counts both phases
    // u = A v (each row's dot product in column order)
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < m; ++i) {
      const float* row = A + i * ld;
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += static_cast<double>(row[j]) * v[j];
      u[i] = acc;
    }
    r.iters = it;
    const double rho = [&] {
      double q = 0;
      for (double e : u) q += e * e;
      return q;
    }();  // v^T A^T A v, the Rayleigh quotient of A^T A
    if (rho == 0) {  // A v = 0: A = 0 (v was a unit vector of a nonzero A with prob. 1)
      r.sigma = 0;
      r.converged = true;
      return r;
    }
    // w = A^T u = A^T A v: each column's sum over rows in row order, columns split across
    // threads (the same sums whatever the number of threads).
    const int64_t blk = 256;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t j0 = 0; j0 < n; j0 += blk) {
      const int64_t j1 = std::min(n, j0 + blk);
      for (int64_t j = j0; j < j1; ++j) w[j] = 0;
      for (int64_t i = 0; i < m; ++i) {
        const float* row = A + i * ld;
        const double ui = u[i];
        for (int64_t j = j0; j < j1; ++j) w[j] += ui * static_cast<double>(row[j]);
      }
    }
    // Converged when v is an eigenvector of A^T A to tol: ||A^T A v - rho v|| <= tol rho.
    // (A criterion on the change of the estimate stops early when sigma_2 is close to
    // sigma_1 and each iteration gains little; the residual does not.)
    double res = 0, nw = 0;
    for (int64_t j = 0; j < n; ++j) {
      res += (w[j] - rho * v[j]) * (w[j] - rho * v[j]);
      nw += w[j] * w[j];
    }
    nw = std::sqrt(nw);
    r.sigma = nw / std::sqrt(rho);  // ||A^T A v|| / ||A v||: >= ||A v||, closer to sigma_1
    for (int64_t j = 0; j < n; ++j) v[j] = w[j] / nw;
    if (std::sqrt(res) <= tol * rho) {
      r.converged = true;
      break;
    }
  }
  return r;
}

}  // namespace st
