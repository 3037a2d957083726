// GEMM tile grids on this machine (issue 22): the step's GEMM shapes (GPT-2 124M, B*T = 256
// rows: forward, input gradient and weight gradient of qkv, attention projection, MLP up
// and down, LM head) cut into fixed tiles of TM x TN outputs, each tile one
// single-threaded OpenBLAS call over the whole K, OpenMP threads taking tiles, as
// layers/matmul_cpu.cpp does with 256 x 256. Prints GFLOP/s per shape and tile grid (best
// of 3 after a warm-up) and marks with * a grid whose outputs are not bit-identical to
// 256 x 256's: the tile grid decides the bits, so the grid is part of the results.
//
// build and run (2 threads, passive waiting as stabletrain runs):
//   g++ -O2 -march=native -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-openmp \
//       bench/plans/gemm_tiles.cpp -o /tmp/gemm_tiles -lopenblas
//   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/gemm_tiles
#include <cblas.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <random>
extern "C" void openblas_set_num_threads(int);
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc, int TM, int TN) {
  const int tm = (M + TM - 1) / TM, tn = (N + TN - 1) / TN;
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < tm * tn; ++t) {
    const int i0 = (t / tn) * TM, j0 = (t % tn) * TN;
    const int m = std::min(TM, M - i0), n = std::min(TN, N - j0);
    const float* a = ta == CblasNoTrans ? A + (size_t)i0 * lda : A + i0;
    const float* b = tb == CblasNoTrans ? B + j0 : B + (size_t)j0 * ldb;
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, K, 1.f, a, lda, b, ldb, beta, C + (size_t)i0 * ldc + j0, ldc);
  }
}
int main() {
  openblas_set_num_threads(1);
  std::mt19937 g(1); std::normal_distribution<float> nd;
  struct S { const char* name; CBLAS_TRANSPOSE ta, tb; int M, N, K; int lda, ldb; float beta; int reps; };
  // fwd: out(256,OC) = inp(256,C) W(OC,C)^T ; dinp(256,C) = dout(256,OC) W(OC,C); dW(OC,C) += dout^T inp
  std::vector<S> shapes;
  int Cs[][2] = {{768,2304},{768,768},{768,3072},{3072,768},{768,50304}};
  int reps[] = {12,12,12,12,1};
  for (int i=0;i<5;i++){int C=Cs[i][0],OC=Cs[i][1];
    shapes.push_back({"fwd",CblasNoTrans,CblasTrans,256,OC,C,C,C,0.f,reps[i]});
    shapes.push_back({"dinp",CblasNoTrans,CblasNoTrans,256,C,OC,OC,C,0.f,reps[i]});
    shapes.push_back({"dW",CblasTrans,CblasNoTrans,OC,C,256,OC,C,1.f,reps[i]});}
  int tiles[][2] = {{256,256},{512,256},{256,512},{128,256},{256,128},{512,512},{256,768}};
  for (auto& s : shapes) {
    size_t na = (s.ta==CblasNoTrans? (size_t)s.M*s.lda : (size_t)s.K*s.lda);
    size_t nb = (s.tb==CblasNoTrans? (size_t)s.K*s.ldb : (size_t)s.N*s.ldb);
    std::vector<float> A(na), B(nb), C0((size_t)s.M*s.N), C1(C0.size());
    for (auto& x : A) x = nd(g); for (auto& x : B) x = nd(g);
    printf("%-5s M=%5d N=%5d K=%5d:", s.name, s.M, s.N, s.K);
    for (auto& tl : tiles) {
      double best = 1e9;
      for (int r = 0; r < 4; r++) {
        std::fill(C1.begin(), C1.end(), 0.5f);
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < s.reps; k++) gemm(s.ta, s.tb, s.M, s.N, s.K, A.data(), s.lda, B.data(), s.ldb, 0.f, C1.data(), s.N, tl[0], tl[1]);
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count()/s.reps;
        if (r) best = std::min(best, dt);
      }
      if (tl[0] == 256 && tl[1] == 256) C0 = C1;
      bool same = memcmp(C0.data(), C1.data(), C0.size()*4) == 0;
      printf(" %dx%d %.0f%s", tl[0], tl[1], 2.0*s.M*s.N*s.K/best/1e9, same?"":"*");
    }
    printf("\n");
  }
}
