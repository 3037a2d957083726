// LayerNorm (eps 1e-5), layers/layernorm_cpu.cpp's formulas operation for operation:
// Forward, one warp per row: m = sum(x)/C; var = sum((x-m)^2)/C; s = 1/sqrt(var + eps)
// (IEEE division and square root); out = round(((x - m) * s) * w + b). mean and rstd are
// stored in FP32. Fused with the residual add (residual_layernorm_forward): x = round(a + b)
// is made and stored in the first pass over the row, then normalised as above (one launch,
// one read of a and b, instead of residual_forward's write and layernorm_forward's re-read).
// Backward: (1) one warp per row: dnm = sum(w*d)/C, dnnm = sum(w*d * ((x-m)*s))/C, then
// dinp = round(dinp + ((w*d - dnm) - n*dnnm) * s) with n = (x-m)*s, once per element.
// (2) dweight/dbias: column sums over rows in two passes, no atomics: chunks of kColChunk
// rows are summed in row order per column into FP32 partials, then each column's partials
// are summed in chunk order and added once: round(dw + sum). With N <= kColChunk that is
// the CPU's row-order sum exactly. For C <= 1024 (1) and the partials of (2) run as one
// kernel, a block per chunk, with the same operations in the same order (same bits; dout
// and inp are read once); wider rows run them as two kernels.
// Rounding points are the CPU's; the only differences are the order of the row sums inside
// a warp (lane-strided partials, then an XOR butterfly; the CPU sums sequentially) and the
// chunked column sums, i.e. FP32 reassociation.
// 128-bit loads when C is a multiple of the vector width and every row pointer is aligned.
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace st::cudak {
namespace {

constexpr float kEps = static_cast<float>(1e-5);  // the CPU's T(1e-5)
constexpr int kThreads = 256;                     // 8 warps, 8 rows per block
constexpr int kRowsPerBlock = kThreads / 32;

// kResidual: the row is first made as res = round(a + b) (residual_forward's arithmetic),
// stored, and normalised in the same pass structure; inp then points at res, which the
// thread re-reads in passes 2 and 3 (its own writes). Either way the sums run over the same
// stored values in the same lane-strided order, so the fused kernel's out, mean and rstd are
// bit-identical to residual_forward followed by layernorm_forward.
template <class T, int V, bool kResidual>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                             const T* bias, int N, int C, T* res, const T* ra, const T* rb) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // the whole warp leaves together
  const size_t off = static_cast<size_t>(row) * C;
  const T* x = inp + off;
  float sum = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    Vec<T, V> xv;
    if constexpr (kResidual) {
      const Vec<T, V> av = load_vec<V>(ra + off + c);
      const Vec<T, V> bv = load_vec<V>(rb + off + c);
#pragma unroll
      for (int k = 0; k < V; ++k) xv.v[k] = from_float<T>(to_float(av.v[k]) + to_float(bv.v[k]));
      store_vec<V>(res + off + c, xv);
    } else {
      xv = load_vec<V>(x + c);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) sum += to_float(xv.v[k]);
  }
  const float m = warp_sum(sum) / static_cast<float>(C);
  float var = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    const Vec<T, V> xv = load_vec<V>(x + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float d = to_float(xv.v[k]) - m;
      var += d * d;
    }
  }
  var = warp_sum(var) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(var + kEps);
  T* o = out + off;
  for (int c = lane * V; c < C; c += 32 * V) {
    const Vec<T, V> xv = load_vec<V>(x + c);
    const Vec<T, V> wv = load_vec<V>(weight + c);
    const Vec<T, V> bv = load_vec<V>(bias + c);
    Vec<T, V> ov;
#pragma unroll
    for (int k = 0; k < V; ++k)
      ov.v[k] = from_float<T>((to_float(xv.v[k]) - m) * s * to_float(wv.v[k]) + to_float(bv.v[k]));
    store_vec<V>(o + c, ov);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// One row's dinp, by one warp (lanes stride the row by 32 * V). When sd is given (the fused
// kernel), the second pass also stages each column's d (the stored dout value) at sd[c] and
// d * n at sdn[c] (FP32, the partial kernel's value: n = (x - m) * s rounded, then d * n
// rounded), and, when sg is given, the dinp value it stores at sg[c].
template <class T, int V>
__device__ __forceinline__ void layernorm_dinp_row(T* di, const T* d, const T* x, const T* weight,
                                                   float m, float s, int C, int lane, T* sd,
                                                   float* sdn, T* sg) {
  float dnm = 0.0f, dnnm = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    const Vec<T, V> xv = load_vec<V>(x + c);
    const Vec<T, V> dv = load_vec<V>(d + c);
    const Vec<T, V> wv = load_vec<V>(weight + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float dn = to_float(wv.v[k]) * to_float(dv.v[k]);
      dnm += dn;
      dnnm += dn * ((to_float(xv.v[k]) - m) * s);
    }
  }
  dnm = warp_sum(dnm) / static_cast<float>(C);
  dnnm = warp_sum(dnnm) / static_cast<float>(C);
  for (int c = lane * V; c < C; c += 32 * V) {
    const Vec<T, V> xv = load_vec<V>(x + c);
    const Vec<T, V> dv = load_vec<V>(d + c);
    const Vec<T, V> wv = load_vec<V>(weight + c);
    Vec<T, V> gv = load_vec<V>(di + c);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float n = (to_float(xv.v[k]) - m) * s;
      const float g = (to_float(wv.v[k]) * to_float(dv.v[k]) - dnm - n * dnnm) * s;
      gv.v[k] = from_float<T>(to_float(gv.v[k]) + g);
      if (sd) sdn[c + k] = to_float(dv.v[k]) * n;
    }
    if (sd) store_vec<V>(sd + c, dv);
    if (sg) store_vec<V>(sg + c, gv);
    store_vec<V>(di + c, gv);
  }
}

template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    layernorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* mean,
                          const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  layernorm_dinp_row<T, V>(dinp + off, dout + off, inp + off, weight, mean[row], rstd[row], C,
                           lane, nullptr, nullptr, nullptr);
}

// The fused backward: one block per chunk of kColChunk rows writes the chunk's dinp rows and
// its dweight/dbias partials, reading dout and inp once (the unfused pair reads them twice).
// Rounds of kFusedWarps rows: warp w takes the round's row w, computes its dinp as
// layernorm_dinp_kernel does and stages the row's d (T) and d * n (FP32) in shared memory;
// after a barrier each thread adds the round's rows, in row order, into the accumulators of
// its columns (c = threadIdx.x + i * kFusedThreads). Each column's partial is therefore the
// partial kernel's sum (the chunk's rows in row order, the same rounded terms): same bits.
// kNext: the stored dinp rows are staged too and summed the same way into part_next, the
// first pass of colsum_accumulate over dinp (the bias gradient of the GEMM that wrote the
// residual stream this layernorm read), so that pass needs no read of dinp.
// kFusedWarps rows a round: 32 warps (2 rounds per chunk, one block per SM) where the
// staging fits in an SM's 227 KiB, else 16 (4 rounds). Each round costs a dependent load of
// the rows and a barrier; the cost model put 8 warps at 64.4 us for B*T = 8192 x 768 (8
// rounds), 16 at 40.0, 32 at 27.7 (tests/simt/cost, 2026-11-29).
constexpr int kFusedMaxC = 1024;
constexpr size_t kFusedMaxSmem = 227 * 1024;  // dynamic shared memory per block, sm_90
// Staging bytes: [kWarps][C] FP32 d*n, then [kWarps][C] of T: d, then (next) dinp.
constexpr size_t fused_smem(int warps, int C, size_t tsize, bool next) {
  return static_cast<size_t>(warps) * static_cast<size_t>(C) * (4 + tsize * (next ? 2 : 1));
}
template <class T, int V, int kFusedWarps, bool kNext>
__global__ void __launch_bounds__(32 * kFusedWarps)
    layernorm_backward_fused_kernel(T* dinp, float* part_dw, float* part_db, float* part_next,
                                    const T* dout, const T* inp, const T* weight,
                                    const float* mean, const float* rstd, int N, int C) {
  constexpr int kFusedThreads = 32 * kFusedWarps;
  constexpr int kFusedColsPerThread = (kFusedMaxC + kFusedThreads - 1) / kFusedThreads;
  static_assert(kColChunk % kFusedWarps == 0, "a chunk is whole rounds");
  ST_SHARED_DYNAMIC(unsigned char, stage, 16);
  const size_t rc = static_cast<size_t>(kFusedWarps) * C;  // staged values per array
  float* const sdn = reinterpret_cast<float*>(stage);
  T* const sd = reinterpret_cast<T*>(stage + rc * sizeof(float));
  T* const sg = kNext ? sd + rc : nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = blockIdx.x;
  const int r0 = chunk * kColChunk;
  const int r1 = min(N, r0 + kColChunk);
  float dw[kFusedColsPerThread], db[kFusedColsPerThread], dn[kFusedColsPerThread];
#pragma unroll
  for (int i = 0; i < kFusedColsPerThread; ++i) dw[i] = db[i] = dn[i] = 0.0f;
  for (int rb = r0; rb < r1; rb += kFusedWarps) {
    const int row = rb + warp;
    if (row < r1) {
      const size_t off = static_cast<size_t>(row) * C;
      const size_t so = static_cast<size_t>(warp) * C;
      layernorm_dinp_row<T, V>(dinp + off, dout + off, inp + off, weight, mean[row], rstd[row],
                               C, lane, sd + so, sdn + so, kNext ? sg + so : nullptr);
    }
    __syncthreads();
    const int rows = min(kFusedWarps, r1 - rb);
#pragma unroll
    for (int i = 0; i < kFusedColsPerThread; ++i) {
      const int c = threadIdx.x + i * kFusedThreads;
      if (c < C) {
        for (int w = 0; w < rows; ++w) {
          const size_t j = static_cast<size_t>(w) * C + c;
          db[i] += to_float(sd[j]);
          dw[i] += sdn[j];
          if constexpr (kNext) dn[i] += to_float(sg[j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kFusedColsPerThread; ++i) {
    const int c = threadIdx.x + i * kFusedThreads;
    if (c < C) {
      part_dw[static_cast<size_t>(chunk) * C + c] = dw[i];
      part_db[static_cast<size_t>(chunk) * C + c] = db[i];
      if constexpr (kNext) part_next[static_cast<size_t>(chunk) * C + c] = dn[i];
    }
  }
}

// Partials of dweight and dbias for rows [chunk*kColChunk, ...) : part_dw/part_db (chunks, C),
// for rows wider than the fused kernel takes. One thread per V consecutive columns (16-byte
// loads when V > 1); each column's sums run over the chunk's rows in row order, whatever V is.
template <class T, int V>
__global__ void layernorm_dwdb_partial_kernel(float* part_dw, float* part_db, const T* dout,
                                              const T* inp, const float* mean, const float* rstd,
                                              int N, int C) {
  const int chunk = blockIdx.x;
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * V;
  if (c >= C) return;
  const int r0 = chunk * kColChunk;
  const int r1 = min(N, r0 + kColChunk);
  float dw[V], db[V];
#pragma unroll
  for (int k = 0; k < V; ++k) dw[k] = db[k] = 0.0f;
  // Rows in batches of kRowBatch: the batch's loads first, then its adds in row order (4:
  // 8 rows of two 16-byte vectors took 168 registers, one block per SM).
  constexpr int kRowBatch = 4;
  static_assert(kColChunk % kRowBatch == 0, "a chunk is whole batches");
  for (int rb = r0; rb < r1; rb += kRowBatch) {
    Vec<T, V> dv[kRowBatch], xv[kRowBatch];
    float m[kRowBatch], s[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (rb + u < r1) {
        const size_t i = static_cast<size_t>(rb + u) * C + c;
        dv[u] = load_vec<V>(dout + i);
        xv[u] = load_vec<V>(inp + i);
        m[u] = mean[rb + u];
        s[u] = rstd[rb + u];
      }
    }
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (rb + u < r1) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float d = to_float(dv[u].v[k]);
          db[k] += d;
          dw[k] += d * ((to_float(xv[u].v[k]) - m[u]) * s[u]);
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    part_dw[static_cast<size_t>(chunk) * C + c + k] = dw[k];
    part_db[static_cast<size_t>(chunk) * C + c + k] = db[k];
  }
}

template <class T>
__global__ void layernorm_dwdb_final_kernel(T* dweight, T* dbias, const float* part_dw,
                                            const float* part_db, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float dw = chunk_sum(part_dw, chunks, C, c);
  const float db = chunk_sum(part_db, chunks, C, c);
  dweight[c] = from_float<T>(to_float(dweight[c]) + dw);
  dbias[c] = from_float<T>(to_float(dbias[c]) + db);
}

int chunks_of(int N) {
  return (N + kColChunk - 1) / kColChunk;
}

}  // namespace

namespace {

// The forward, plain (res null: inp is the row) or fused with the residual add (res = a + b
// first, inp ignored).
void launch_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                    const void* bias, int N, int C, DType dtype, cudaStream_t stream, void* res,
                    const void* a, const void* b) {
  if (N == 0) return;
  const unsigned grid = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
  dispatch_storage(dtype, "layernorm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kWide<T>;
    auto* o = static_cast<T*>(out);
    auto* r = static_cast<T*>(res);
    const auto* x = res ? r : static_cast<const T*>(inp);
    const auto* w = static_cast<const T*>(weight);
    const auto* bi = static_cast<const T*>(bias);
    const auto* ra = static_cast<const T*>(a);
    const auto* rb = static_cast<const T*>(b);
    bool wide = C % W == 0 && aligned16(out) && aligned16(x) && aligned16(weight) && aligned16(bias);
    if (res) wide = wide && aligned16(a) && aligned16(b);
    if (res && wide) {
      cudak::launch(layernorm_forward_kernel<T, W, true>, grid, kThreads, 0, stream, o, mean, rstd,
                    x, w, bi, N, C, r, ra, rb);
    } else if (res) {
      cudak::launch(layernorm_forward_kernel<T, 1, true>, grid, kThreads, 0, stream, o, mean, rstd,
                    x, w, bi, N, C, r, ra, rb);
    } else if (wide) {
      cudak::launch(layernorm_forward_kernel<T, W, false>, grid, kThreads, 0, stream, o, mean, rstd,
                    x, w, bi, N, C, r, ra, rb);
    } else {
      cudak::launch(layernorm_forward_kernel<T, 1, false>, grid, kThreads, 0, stream, o, mean, rstd,
                    x, w, bi, N, C, r, ra, rb);
    }
    ST_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
  });
}

}  // namespace

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C, DType dtype, cudaStream_t stream) {
  launch_forward(out, mean, rstd, inp, weight, bias, N, C, dtype, stream, nullptr, nullptr,
                 nullptr);
}

void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                const void* b, const void* weight, const void* bias, int N, int C,
                                DType dtype, cudaStream_t stream) {
  launch_forward(out, mean, rstd, nullptr, weight, bias, N, C, dtype, stream, res, a, b);
}

size_t layernorm_backward_scratch(int N, int C) {
  return 3 * static_cast<size_t>(chunks_of(N)) * static_cast<size_t>(C);
}

void layernorm_backward(void* dinp, void* dweight, void* dbias, void* dnext, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int N, int C, DType dtype, float* scratch, cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  const int chunks = chunks_of(N);
  constexpr int kColThreads = 256;
  const unsigned ctiles = static_cast<unsigned>((C + kColThreads - 1) / kColThreads);
  ST_CHECK(ctiles <= 65535u, "layernorm_backward: C = ", C, " is too wide");
  float* part_dw = scratch;
  float* part_db = scratch + static_cast<size_t>(chunks) * C;
  float* part_next = scratch + 2 * static_cast<size_t>(chunks) * C;
  const bool next = dnext != nullptr;
  dispatch_storage(dtype, "layernorm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kWide<T>;
    const auto* d = static_cast<const T*>(dout);
    const auto* x = static_cast<const T*>(inp);
    const auto* w = static_cast<const T*>(weight);
    auto* di = static_cast<T*>(dinp);
    const bool wide =
        C % W == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight);
    if (C <= kFusedMaxC) {
      using Kernel = void (*)(T*, float*, float*, float*, const T*, const T*, const T*,
                              const float*, const float*, int, int);
      const bool w32 = fused_smem(32, C, sizeof(T), next) <= kFusedMaxSmem;
      // [warps][wide][next]
      const Kernel kernels[2][2][2] = {
          {{layernorm_backward_fused_kernel<T, 1, 16, false>,
            layernorm_backward_fused_kernel<T, 1, 16, true>},
           {layernorm_backward_fused_kernel<T, W, 16, false>,
            layernorm_backward_fused_kernel<T, W, 16, true>}},
          {{layernorm_backward_fused_kernel<T, 1, 32, false>,
            layernorm_backward_fused_kernel<T, 1, 32, true>},
           {layernorm_backward_fused_kernel<T, W, 32, false>,
            layernorm_backward_fused_kernel<T, W, 32, true>}}};
      const Kernel kernel = kernels[w32][wide][next];
      const size_t smem = fused_smem(w32 ? 32 : 16, C, sizeof(T), next);
      if (smem > 48 * 1024)
        ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
      cudak::launch(kernel, static_cast<unsigned>(chunks), w32 ? 1024 : 512, smem, stream, di,
                    part_dw, part_db, part_next, d, x, w, mean, rstd, N, C);
      ST_CUDA_CHECK_LAUNCH("layernorm_backward_fused_kernel");
    } else {  // wider rows: dinp, then the partials in a second read of dout and inp
      const unsigned grid = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
      if (wide) {
        cudak::launch(layernorm_dinp_kernel<T, W>, grid, kThreads, 0, stream, di, d, x, w, mean,
                      rstd, N, C);
      } else {
        cudak::launch(layernorm_dinp_kernel<T, 1>, grid, kThreads, 0, stream, di, d, x, w, mean,
                      rstd, N, C);
      }
      ST_CUDA_CHECK_LAUNCH("layernorm_dinp_kernel");
      if (C % W == 0 && aligned16(dout) && aligned16(inp)) {
        const unsigned vtiles = static_cast<unsigned>((C / W + kColThreads - 1) / kColThreads);
        cudak::launch(layernorm_dwdb_partial_kernel<T, W>,
                      dim3(static_cast<unsigned>(chunks), vtiles), kColThreads, 0, stream, part_dw,
                      part_db, d, x, mean, rstd, N, C);
      } else {
        cudak::launch(layernorm_dwdb_partial_kernel<T, 1>,
                      dim3(static_cast<unsigned>(chunks), ctiles), kColThreads, 0, stream, part_dw,
                      part_db, d, x, mean, rstd, N, C);
      }
      ST_CUDA_CHECK_LAUNCH("layernorm_dwdb_partial_kernel");
    }
    // 64 threads a block: the final pass is latency-bound, so it spreads over more SMs
    constexpr int kFinalThreads = 64;
    cudak::launch(layernorm_dwdb_final_kernel<T>,
                  static_cast<unsigned>((C + kFinalThreads - 1) / kFinalThreads), kFinalThreads, 0,
                  stream,
                  static_cast<T*>(dweight), static_cast<T*>(dbias), part_dw, part_db, chunks, C);
    ST_CUDA_CHECK_LAUNCH("layernorm_dwdb_final_kernel");
  });
  if (next && C <= kFusedMaxC) {  // the fused kernel wrote part_next
    colsum_finish(dnext, part_next, N, C, dtype, stream);
  } else if (next) {  // the two-kernel path: the column sums of dinp as matmul's dbias makes them
    colsum_accumulate(dnext, dinp, N, C, dtype, part_next, stream);
  }
}

}  // namespace st::cudak
