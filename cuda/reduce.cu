// Reductions, all in a fixed order (no atomics on values), so bit-identical run to run:
//  - colsum_accumulate (matmul dbias): dbias[j] = round(dbias[j] + sum_i dout[i][j]).
//    Pass 1: one thread per column per chunk of kColChunk rows sums the chunk in row order
//    (FP32) into a partial; pass 2: one thread per column sums the partials in chunk order
//    and adds once. N <= kColChunk gives the CPU's row-order sum exactly. Both passes issue
//    the loads of a batch of rows (chunks) before adding them in order (chunk_sum).
//  - sum_squares: the CPU's composition (layers/reduce_cpu.cpp): chunks of kSumChunk = 64K
//    elements, each summed in FP64, then the chunk sums added in chunk order from 0. Inside
//    a chunk a block sums in a fixed tree (each thread a strided sequence, then block_sum)
//    where the CPU sums sequentially: FP64 reassociation only (every square of an FP32 value
//    is exact in FP64). As on the CPU, a view's chunks start at its first element, so a norm
//    assembled from per-shard chunk sums (shards a multiple of 64K) is the same.
//  - any_nonfinite: each block ORs its threads' flags (__syncthreads_or) and one thread
//    stores 1; every store writes the same value, so the outcome does not depend on timing.
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace st::cudak {
namespace {

// One thread per V consecutive columns (16-byte loads when V > 1); each column's sum runs
// over the chunk's rows in row order, whatever V is. The rows come in batches of kRowBatch
// whose loads are all issued before the first add (kRowBatch loads in flight per thread; a
// plain loop's next load waits for the add that uses the previous one, as nvcc compiled the
// V = 8 loop: 2 rows in flight, and the V = 1 loop: 4), then added in row order.
constexpr int kRowBatch = 8;
static_assert(kColChunk % kRowBatch == 0, "a chunk is whole batches (but N need not be)");
template <class T, int V>
__global__ void colsum_partial_kernel(float* part, const T* x, int N, int C) {
  const int chunk = blockIdx.x;
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * V;
  if (c >= C) return;
  const int r0 = chunk * kColChunk;
  const int r1 = min(N, r0 + kColChunk);
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  for (int rb = r0; rb < r1; rb += kRowBatch) {
    Vec<T, V> v[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u)
      if (rb + u < r1) v[u] = load_vec<V>(x + static_cast<size_t>(rb + u) * C + c);
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u)
      if (rb + u < r1) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_float(v[u].v[k]);
      }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) part[static_cast<size_t>(chunk) * C + c + k] = acc[k];
}

template <class T>
__global__ void colsum_final_kernel(T* dst, const float* part, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  dst[c] = from_float<T>(to_float(dst[c]) + chunk_sum(part, chunks, C, c));
}

constexpr int kSumThreads = 512;
constexpr int kFinalThreads = 1024;

template <class T>
__global__ void __launch_bounds__(kSumThreads)
    sumsq_partial_kernel(double* part, const T* x, size_t n) {
  ST_SHARED(double, smem, [32]);
  const size_t base = static_cast<size_t>(blockIdx.x) * kSumChunk;
  const size_t end = min(n, base + kSumChunk);
  double acc = 0.0;
  for (size_t i = base + threadIdx.x; i < end; i += kSumThreads) {
    const double v = static_cast<double>(to_float(x[i]));
    acc += v * v;
  }
  acc = block_sum(acc, smem);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// The chunk sums are added in chunk order, from 0, as the CPU adds its chunk sums: the block
// stages a tile of them in shared memory (coalesced loads), one thread adds the tile in order.
__global__ void __launch_bounds__(kFinalThreads)
    sumsq_final_kernel(double* result, const double* part, size_t nparts) {
  ST_SHARED(double, tile, [kFinalThreads]);
  double total = 0.0;  // meaningful in thread 0
  for (size_t base = 0; base < nparts; base += kFinalThreads) {
    const size_t i = base + threadIdx.x;
    if (i < nparts) tile[threadIdx.x] = part[i];
    __syncthreads();
    if (threadIdx.x == 0) {
      const size_t m = min(static_cast<size_t>(kFinalThreads), nparts - base);
      for (size_t k = 0; k < m; ++k) total += tile[k];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = total;
}

template <class T>
__global__ void nonfinite_kernel(int* flag, const T* x, size_t n) {
  int bad = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bad |= !isfinite(to_float(x[i]));
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

}  // namespace

size_t colsum_scratch(int N, int OC) {
  return static_cast<size_t>((N + kColChunk - 1) / kColChunk) * static_cast<size_t>(OC);
}

void colsum_accumulate(void* dbias, const void* dout, int N, int OC, DType dtype, float* scratch,
                       cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  const int chunks = (N + kColChunk - 1) / kColChunk;
  constexpr int kThreads = 256;
  const unsigned ctiles = static_cast<unsigned>((OC + kThreads - 1) / kThreads);
  ST_CHECK(ctiles <= 65535u, "colsum: OC = ", OC, " is too wide");
  dispatch_storage(dtype, "colsum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kWide<T>;
    const auto* d = static_cast<const T*>(dout);
    if (OC % W == 0 && aligned16(dout)) {
      const unsigned vtiles = static_cast<unsigned>((OC / W + kThreads - 1) / kThreads);
      cudak::launch(colsum_partial_kernel<T, W>, dim3(static_cast<unsigned>(chunks), vtiles),
                    kThreads, 0, stream, scratch, d, N, OC);
    } else {
      cudak::launch(colsum_partial_kernel<T, 1>, dim3(static_cast<unsigned>(chunks), ctiles),
                    kThreads, 0, stream, scratch, d, N, OC);
    }
    ST_CUDA_CHECK_LAUNCH("colsum_partial_kernel");
  });
  colsum_finish(dbias, scratch, N, OC, dtype, stream);
}

void colsum_finish(void* dbias, const float* part, int N, int OC, DType dtype,
                   cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  const int chunks = (N + kColChunk - 1) / kColChunk;
  dispatch_storage(dtype, "colsum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kColFinalThreads = 64;  // latency-bound: over more SMs
    cudak::launch(colsum_final_kernel<T>,
                  static_cast<unsigned>((OC + kColFinalThreads - 1) / kColFinalThreads),
                  kColFinalThreads, 0, stream, static_cast<T*>(dbias), part, chunks, OC);
    ST_CUDA_CHECK_LAUNCH("colsum_final_kernel");
  });
}

size_t sum_squares_scratch(size_t n) {
  return (n + kSumChunk - 1) / kSumChunk;
}

void sum_squares(double* result, const void* x, size_t n, DType dtype, double* scratch,
                 cudaStream_t stream) {
  ST_CHECK(n > 0, "sum_squares of an empty tensor (the caller returns 0)");
  const size_t nparts = sum_squares_scratch(n);
  ST_CHECK(nparts <= 0x7fffffffu, "sum_squares: ", n, " elements is too many");
  dispatch_storage(dtype, "sum_squares", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cudak::launch(sumsq_partial_kernel<T>, static_cast<unsigned>(nparts), kSumThreads, 0, stream,
                  scratch, static_cast<const T*>(x), n);
    ST_CUDA_CHECK_LAUNCH("sumsq_partial_kernel");
  });
  cudak::launch(sumsq_final_kernel, 1, kFinalThreads, 0, stream, result, scratch, nparts);
  ST_CUDA_CHECK_LAUNCH("sumsq_final_kernel");
}

void any_nonfinite(int* flag, const void* x, size_t n, DType dtype, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  dispatch_storage(dtype, "all_finite", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cudak::launch(nonfinite_kernel<T>, grid_for(n, kThreads), kThreads, 0, stream, flag,
                  static_cast<const T*>(x), n);
    ST_CUDA_CHECK_LAUNCH("nonfinite_kernel");
  });
}

}  // namespace st::cudak
