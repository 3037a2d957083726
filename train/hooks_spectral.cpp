// Spectral norms for the stability hooks (spectral_norm, train/hooks_spectral.h): power
// iteration on A^T A of a weight slice, warm-started from the previous hook's vector, with a
// cold start on the small Gram matrix for thin matrices and restarted Lanczos for wide ones.
// FP64; results do not depend on threads.
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


// w = A^T (A v), with u = A v: every row's dot product in column order, every column's sum
// over rows in row order, columns split across threads (the same sums whatever the number
// of threads). Returns ||A v||^2.
double gram_apply(const float* A, int64_t ld, int64_t m, int64_t n, const std::vector<double>& v,
                  std::vector<double>& u, std::vector<double>& w, bool par) {
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < m; ++i) {
    const float* row = A + i * ld;
    double acc = 0;
    for (int64_t j = 0; j < n; ++j) acc += static_cast<double>(row[j]) * v[j];
    u[i] = acc;
  }
  double q = 0;
  for (double e : u) q += e * e;
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
  return q;
}

// Largest eigenpair of a symmetric k x k matrix S (row-major, destroyed) by cyclic Jacobi
// rotations in FP64; returns the eigenvalue and leaves its unit eigenvector in x.
double jacobi_top(std::vector<double>& S, int k, std::vector<double>& x) {
  std::vector<double> V(static_cast<size_t>(k) * k, 0.0);
  for (int i = 0; i < k; ++i) V[static_cast<size_t>(i) * k + i] = 1;
  auto at = [&](int i, int j) -> double& { return S[static_cast<size_t>(i) * k + j]; };
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0, diag = 0;
    for (int i = 0; i < k; ++i) {
      diag += at(i, i) * at(i, i);
      for (int j = i + 1; j < k; ++j) off += at(i, j) * at(i, j);
    }
    if (off <= 1e-30 * diag) break;
    for (int p = 0; p < k; ++p)
      for (int q = p + 1; q < k; ++q) {
        const double apq = at(p, q);
        if (apq == 0) continue;
        const double theta = (at(q, q) - at(p, p)) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), sn = t * c;
        for (int r = 0; r < k; ++r) {  // columns p, q
          const double sp = at(r, p), sq = at(r, q);
          at(r, p) = c * sp - sn * sq;
          at(r, q) = sn * sp + c * sq;
        }
        for (int r = 0; r < k; ++r) {  // rows p, q
          const double sp = at(p, r), sq = at(q, r);
          at(p, r) = c * sp - sn * sq;
          at(q, r) = sn * sp + c * sq;
        }
        for (int r = 0; r < k; ++r) {
          double& vp = V[static_cast<size_t>(r) * k + p];
          double& vq = V[static_cast<size_t>(r) * k + q];
          const double a = vp, b = vq;
          vp = c * a - sn * b;
          vq = sn * a + c * b;
        }
      }
  }
  int top = 0;
  for (int i = 1; i < k; ++i)
    if (at(i, i) > at(top, top)) top = i;
  x.assign(static_cast<size_t>(k), 0.0);
  for (int r = 0; r < k; ++r) x[r] = V[static_cast<size_t>(r) * k + top];
  return at(top, top);
}

// Cold start of a matrix too wide for the Gram start: restarted Lanczos on A^T A (cycles
// of up to kLanczosCycle steps with full reorthogonalisation in FP64, each restarted from
// the last cycle's top Ritz vector; a cycle ends early once its Ritz pair converged,
// checked every kLanczosCheck steps) until the Ritz pair's residual beta |s_k| is at most
// tol / 2 times the Ritz value, or max_iters matrix-vector pairs are spent. Lanczos gains
// per step what power iteration gains per sqrt(gap)^-1 steps, so the clustered top of
// random weights takes tens of passes over A instead of hundreds. Leaves the Ritz vector in
// v (unit length) and returns the passes used; the power iteration after it checks the
// residual against tol itself.
constexpr int kLanczosCycle = 64, kLanczosCheck = 8;

// The top Ritz pair of the Lanczos tridiagonal (alpha, beta) and whether its residual
// beta_k |s_k| is at most tol / 2 times the Ritz value.
double ritz_top(const std::vector<double>& alpha, const std::vector<double>& beta,
                std::vector<double>& s) {
  const int k = static_cast<int>(alpha.size());
  std::vector<double> T(static_cast<size_t>(k) * k, 0.0);
  for (int i = 0; i < k; ++i) {
    T[static_cast<size_t>(i) * k + i] = alpha[i];
    if (i + 1 < k) T[static_cast<size_t>(i) * k + i + 1] = T[static_cast<size_t>(i + 1) * k + i] = beta[i];
  }
  return jacobi_top(T, k, s);
}
bool ritz_converged(const std::vector<double>& alpha, const std::vector<double>& beta,
                    double tol) {
  std::vector<double> s;
  const double theta = ritz_top(alpha, beta, s);
  return theta > 0 && beta.back() * std::fabs(s.back()) <= 0.5 * tol * theta;
}

int lanczos_start(const float* A, int64_t ld, int64_t m, int64_t n, std::vector<double>& v,
                  double tol, int max_iters, bool par) {
  std::vector<double> u(static_cast<size_t>(m)), w(static_cast<size_t>(n));
  int used = 0;
  {
    const double nv = norm2(v);
    for (auto& e : v) e /= nv;
  }
  while (used < max_iters) {
    const int K = static_cast<int>(std::min<int64_t>({kLanczosCycle, n, max_iters - used}));
    if (K < 2) break;
    std::vector<std::vector<double>> Q{v};
    std::vector<double> alpha, beta;
    for (int j = 0; j < K; ++j) {
      gram_apply(A, ld, m, n, Q[j], u, w, par);
      ++used;
      double a = 0;
      for (int64_t i = 0; i < n; ++i) a += Q[j][i] * w[i];
      alpha.push_back(a);
      // Full reorthogonalisation against every earlier vector (twice: "twice is enough").
      for (int pass = 0; pass < 2; ++pass)
        for (int q = 0; q <= j; ++q) {
          double d = 0;
          for (int64_t i = 0; i < n; ++i) d += Q[q][i] * w[i];
          for (int64_t i = 0; i < n; ++i) w[i] -= d * Q[q][i];
        }
      const double b = norm2(w);
      beta.push_back(b);
      if (j + 1 == K || b <= 1e-14 * std::fabs(alpha[0])) break;
      // Every kLanczosCheck steps: stop the cycle once its Ritz pair has converged.
      if ((j + 1) % kLanczosCheck == 0 && ritz_converged(alpha, beta, tol)) break;
      std::vector<double> next(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) next[i] = w[i] / b;
      Q.push_back(std::move(next));
    }
    const int k = static_cast<int>(alpha.size());
    std::vector<double> s;
    const double theta = ritz_top(alpha, beta, s);
    std::fill(v.begin(), v.end(), 0.0);
    for (int q = 0; q < k; ++q)
      for (int64_t i = 0; i < n; ++i) v[i] += s[q] * Q[q][i];
    const double nv = norm2(v);
    for (auto& e : v) e /= nv;
    if (theta <= 0 || beta[k - 1] * std::fabs(s[k - 1]) <= 0.5 * tol * theta) break;
  }
  return used;
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
    const std::vector<double> random_start = v;
    if (k <= kGramMaxSide && k > 1 && max_iters > 1)
      r.iters = gram_start(A, ld, m, n, v, tol, max_iters - 1, par);
    else if (k > kGramMaxSide && max_iters > 1)
      r.iters = lanczos_start(A, ld, m, n, v, tol, max_iters - 1, par);
    // A zero matrix has no direction to find (0 / 0): keep the random start, so the
    // vector saved for the next hook (and in checkpoints) is a finite unit vector.
    const double nv = norm2(v);
    if (!(nv > 0) || !std::isfinite(nv)) v = random_start;
  }
  {
    const double nv = norm2(v);
    for (auto& e : v) e /= nv;
  }
  std::vector<double> u(static_cast<size_t>(m)), w(static_cast<size_t>(n));
  const int first = r.iters;
  for (int it = first + 1; it <= max_iters; ++it) {  // max_iters counts both phases
    const double rho = gram_apply(A, ld, m, n, v, u, w, par);  // v^T A^T A v, w = A^T A v
    r.iters = it;
    if (rho == 0) {  // A v = 0: A = 0 (v was a unit vector of a nonzero A with prob. 1)
      r.sigma = 0;
      r.converged = true;
      return r;
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
