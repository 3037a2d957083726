// LayerNorm (eps 1e-5). Forward: mean and rstd kept in T (FP32), out = round(n*w + b)
// with n = (x - mean) * rstd. Backward: dinp += (dout*w - mean(dout*w) - n*mean(dout*w*n))
// * rstd, rounded once per element; dweight/dbias summed over rows in row order per
// column (deterministic for any thread count), then added once.
#include <algorithm>
#include <cmath>
#include <vector>

#include "layers/cpu_kernels.h"

namespace st::cpu {

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C, DType fmt) {
  const T eps = T(1e-5);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* x = inp + static_cast<size_t>(i) * C;
    T m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    T var = 0;
    for (int c = 0; c < C; ++c) {
      const T d = x[c] - m;
      var += d * d;
    }
    var /= C;
    const T s = T(1) / std::sqrt(var + eps);
    T* o = out + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) o[c] = round_to(fmt, (x[c] - m) * s * weight[c] + bias[c]);
    mean[i] = m;
    rstd[i] = s;
  }
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int N, int C, DType fmt) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* x = inp + static_cast<size_t>(i) * C;
    const T* d = dout + static_cast<size_t>(i) * C;
    const T m = mean[i], s = rstd[i];
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const T dn = weight[c] * d[c];
      dnorm_mean += dn;
      dnorm_norm_mean += dn * ((x[c] - m) * s);
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    T* di = dinp + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) {
      const T n = (x[c] - m) * s;
      const T g = (weight[c] * d[c] - dnorm_mean - n * dnorm_norm_mean) * s;
      di[c] = round_to(fmt, di[c] + g);
    }
  }
  // Column blocks keep the row sweep contiguous; each column's sum stays in row order.
  constexpr int kBlock = 64;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    T dw[kBlock] = {}, db[kBlock] = {};
    for (int i = 0; i < N; ++i) {
      const T* d = dout + static_cast<size_t>(i) * C;
      const T* x = inp + static_cast<size_t>(i) * C;
      const T m = mean[i], s = rstd[i];
      for (int c = c0; c < c1; ++c) {
        db[c - c0] += d[c];
        dw[c - c0] += d[c] * ((x[c] - m) * s);
      }
    }
    for (int c = c0; c < c1; ++c) {
      dweight[c] = round_to(fmt, dweight[c] + dw[c - c0]);
      dbias[c] = round_to(fmt, dbias[c] + db[c - c0]);
    }
  }
}

#define INSTANTIATE(T)                                                                      \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int,    \
                                     DType);                                                \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,   \
                                      const T*, int, int, DType);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace st::cpu
