// Matmul through BLAS (sgemm/dgemm). In BF16/FP16 modes the inputs hold BF16/FP16 values,
// whose products are exact in FP32, so an FP32 GEMM followed by one rounding of the output
// emulates a tensor-core GEMM with FP32 accumulation up to summation order.
// Forward: out = round(inp.W^T + bias) (bias added in FP32 before the rounding, as the
// cuBLASLt bias epilogue does). Backward: dinp = round(dout.W); dW = round(dW + dout^T.inp)
// (beta = 1 GEMM, like cuBLASLt with C = D); dbias = round(dbias + colsum(dout)).
#include <cblas.h>

#include <algorithm>

#include "layers/cpu_kernels.h"

namespace st::cpu {
namespace {

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* Cm, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
          const double* A, int lda, const double* B, int ldb, double beta, double* Cm,
          int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}

}  // namespace

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    DType fmt) {
  gemm(CblasNoTrans, CblasTrans, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) {
      T* o = out + static_cast<size_t>(i) * OC;
      for (int j = 0; j < OC; ++j) o[j] = round_to(fmt, o[j] + bias[j]);
    }
  } else {
    round_inplace(fmt, out, static_cast<size_t>(N) * OC);
  }
}

template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                     const T* weight, int N, int C, int OC, DType fmt) {
  if (dinp) {
    gemm(CblasNoTrans, CblasNoTrans, N, C, OC, T(1), dout, OC, weight, C, T(0), dinp, C);
    round_inplace(fmt, dinp, static_cast<size_t>(N) * C);
  }
  gemm(CblasTrans, CblasNoTrans, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  round_inplace(fmt, dweight, static_cast<size_t>(OC) * C);
  if (dbias) {
    // Column blocks, rows summed in order: deterministic for any thread count.
    constexpr int kBlock = 64;
    const int nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; ++blk) {
      const int j0 = blk * kBlock, j1 = std::min(OC, j0 + kBlock);
      T acc[kBlock] = {};
      for (int i = 0; i < N; ++i) {
        const T* d = dout + static_cast<size_t>(i) * OC;
        for (int j = j0; j < j1; ++j) acc[j - j0] += d[j];
      }
      for (int j = j0; j < j1; ++j) dbias[j] = round_to(fmt, dbias[j] + acc[j - j0]);
    }
  }
}

#define INSTANTIATE(T)                                                                      \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int, DType);  \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int, \
                                   DType);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace st::cpu
