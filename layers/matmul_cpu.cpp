// Matmul through BLAS (sgemm/dgemm). In BF16/FP16 modes the inputs hold BF16/FP16 values,
// whose products are exact in FP32, so an FP32 GEMM followed by one rounding of the output
// emulates a tensor-core GEMM with FP32 accumulation up to summation order.
// Forward: out = round(inp.W^T + bias) (bias added in FP32 before the rounding, as the
// cuBLASLt bias epilogue does). Backward: dinp = round(dout.W); dbias = round(dbias +
// colsum(dout)); dW = round(dW + round(dout^T.inp)): the product is rounded to the compute
// format before it is added to the gradient already there, and the sum is rounded again.
// That is what the GPU does: cuBLASLt's beta = 1 GEMM into a BF16/FP16 C = D rounds
// alpha * acc before adding beta * C (measured on an H200, cuBLAS 13: 99.9-100% of the
// elements equal round(C + round(acc)), 75% equal round(C + acc); Gpu.MatmulBackward-
// DweightRoundingModel), and so does PyTorch, whose BF16 .grad accumulation adds an
// already rounded gradient. With one micro-batch (dW zeroed first) both are round(acc).
//
// Thread-count independence: a multithreaded BLAS call partitions the output by thread
// count and picks kernels by partition size, so its bits change with the thread count
// (OpenBLAS 0.3.21: ~7-15% of the outputs of GPT-2's GEMMs differ between 1 and 2 threads).
// Here the output is cut into a fixed grid of tiles that depends only on the GEMM's shape;
// each tile is one single-threaded BLAS call over the whole K, and OpenMP threads take
// tiles. The same tile always runs the same code, so results are identical for any thread
// count, and a run may change its thread count (run.threads: auto) without changing a bit.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/error.h"
#include "layers/cpu_kernels.h"

namespace st::cpu {
namespace {

void gemm1(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
           const float* A, int lda, const float* B, int ldb, float beta, float* Cm, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}
void gemm1(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
           const double* A, int lda, const double* B, int ldb, double beta, double* Cm,
           int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}

// Tile sides: large enough for BLAS to run near its single-core peak, small enough that
// GPT-2's GEMMs have several tiles per thread.
constexpr int kTileM = 256, kTileN = 256;

// Row-major C (M x N) = alpha op(A) op(B) + beta C, to be cut into tiles as above.
template <class T>
struct Gemm {
  CBLAS_TRANSPOSE ta, tb;
  int M, N, K;
  T alpha;
  const T* A;
  int lda;
  const T* B;
  int ldb;
  T beta;
  T* C;
  int ldc;
  int tiles() const { return ((M + kTileM - 1) / kTileM) * ((N + kTileN - 1) / kTileN); }
  void tile(int t) const {
    const int tn = (N + kTileN - 1) / kTileN;
    const int i0 = (t / tn) * kTileM, j0 = (t % tn) * kTileN;
    const int m = std::min(kTileM, M - i0), n = std::min(kTileN, N - j0);
    const T* a = ta == CblasNoTrans ? A + static_cast<size_t>(i0) * lda : A + i0;
    const T* b = tb == CblasNoTrans ? B + j0 : B + static_cast<size_t>(j0) * ldb;
    gemm1(ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, C + static_cast<size_t>(i0) * ldc + j0,
          ldc);
  }
};

// Runs independent GEMMs (no output overlaps another's operands) as one pool of tiles that
// OpenMP threads take in order, the first GEMM's tiles first: a GEMM with few tiles (GPT-2's
// 256 x 768 outputs are 3) then shares the threads with the next one's instead of leaving a
// thread idle. Each tile is the same single-threaded BLAS call whatever the pool, so the
// bits are those of running the GEMMs one after another (BLAS must be single-threaded: the
// CPU backend sets OpenBLAS to one thread).
template <class T>
void gemm_pool(std::initializer_list<Gemm<T>> list) {
  constexpr int kMax = 4;
  const Gemm<T>* g = list.begin();
  ST_CHECK(list.size() <= kMax, "gemm_pool: at most ", kMax, " GEMMs");
  const int n = static_cast<int>(list.size());
  int first[kMax + 1] = {};  // tile index where each GEMM starts
  for (int i = 1; i <= n; ++i) first[i] = first[i - 1] + g[i - 1].tiles();
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < first[n]; ++t) {
    int i = 0;
    while (t >= first[i + 1]) ++i;
    g[i].tile(t - first[i]);
  }
}

}  // namespace

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    DType fmt) {
  gemm_pool<T>({{CblasNoTrans, CblasTrans, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC}});
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
  // dinp = dout.W and dW (+)= dout^T.inp in one pool of tiles (they read the same inputs and
  // write different buffers; the CPU backend checks that none overlaps).
  const size_t nw = static_cast<size_t>(OC) * C;
  const bool in_place = fmt == DType::F32 || fmt == DType::F64;  // nothing rounded: accumulate
  thread_local std::vector<T> product;  // reused: dW of the LM head is 38.6M values
  if (!in_place) product.resize(nw);
  const Gemm<T> dw{CblasTrans, CblasNoTrans, OC, C, N, T(1), dout, OC, inp, C,
                   in_place ? T(1) : T(0), in_place ? dweight : product.data(), C};
  if (dinp)
    gemm_pool<T>({{CblasNoTrans, CblasNoTrans, N, C, OC, T(1), dout, OC, weight, C, T(0), dinp, C},
                  dw});
  else
    gemm_pool<T>({dw});
  if (dinp) round_inplace(fmt, dinp, static_cast<size_t>(N) * C);
  if (!in_place) {
    T* p = product.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(nw); ++i)
      dweight[i] = round_to(fmt, dweight[i] + round_to(fmt, p[i]));
  }
  if (dbias) bias_backward(dbias, dout, N, OC, fmt);
}

template <class T>
void bias_backward(T* dbias, const T* dout, int N, int OC, DType fmt) {
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

#define INSTANTIATE(T)                                                                      \
  template void bias_backward<T>(T*, const T*, int, int, DType);                            \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int, DType);  \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int, \
                                   DType);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace st::cpu
