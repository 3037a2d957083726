// Elementwise kernels: tanh-GELU forward/backward, the residual add, and in-place rounding
// of FP32 storage to BF16/FP16 (round_copy). The formulas are layers/activation_cpu.cpp's,
// operation for operation (same constants, same association; built with --fmad=false, so no
// contraction into FMA): each output is computed in FP32 and rounded once when stored.
// The residual add is bit-identical to the CPU; GELU differs only by tanhf, whose CUDA and
// glibc implementations may differ in the last FP32 bit.
// Each thread handles whole 128-bit vectors when every pointer is 16-byte aligned, then a
// scalar tail; without that alignment, the scalar loop does everything. Outputs may alias
// inputs (element i is read and written by the same thread), so nothing is __restrict__.
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace st::cudak {
namespace {

// The CPU's constants: T(0.7978845608028654), T(0.044715) with T = float.
constexpr float kGeluScale = static_cast<float>(0.7978845608028654);
constexpr float kGeluCoef = static_cast<float>(0.044715);

struct GeluForward {
  __device__ float operator()(float x) const {
    const float cube = kGeluCoef * x * x * x;
    return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
  }
};

struct GeluBackward {  // (inp, dout)
  __device__ float operator()(float x, float d) const {
    const float cube = kGeluCoef * x * x * x;
    const float u = kGeluScale * (x + cube);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float local =
        0.5f * (1.0f + th) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCoef * x * x);
    return local * d;
  }
};

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <class T, int V, class Op>
__global__ void unary_kernel(T* out, const T* a, size_t nvec, size_t n) {
  const Op op;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = tid; i < nvec; i += stride) {
    const Vec<T, V> x = load_vec<V>(a + i * V);
    Vec<T, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = from_float<T>(op(to_float(x.v[k])));
    store_vec<V>(out + i * V, y);
  }
  for (size_t i = nvec * V + tid; i < n; i += stride) out[i] = from_float<T>(op(to_float(a[i])));
}

template <class T, int V, class Op>
__global__ void binary_kernel(T* out, const T* a, const T* b, size_t nvec, size_t n) {
  const Op op;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = tid; i < nvec; i += stride) {
    const Vec<T, V> x = load_vec<V>(a + i * V);
    const Vec<T, V> y = load_vec<V>(b + i * V);
    Vec<T, V> z;
#pragma unroll
    for (int k = 0; k < V; ++k) z.v[k] = from_float<T>(op(to_float(x.v[k]), to_float(y.v[k])));
    store_vec<V>(out + i * V, z);
  }
  for (size_t i = nvec * V + tid; i < n; i += stride)
    out[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
}

constexpr int kThreads = 256;

template <class Op>
void launch_unary(void* out, const void* a, size_t n, DType dtype, cudaStream_t stream,
                  const char* what) {
  if (n == 0) return;
  dispatch_storage(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = kWide<T>;
    const size_t nvec = aligned16(out) && aligned16(a) ? n / V : 0;
    const unsigned grid = grid_for(nvec > 0 ? nvec : n, kThreads);
    cudak::launch(unary_kernel<T, V, Op>, grid, kThreads, 0, stream, static_cast<T*>(out),
                  static_cast<const T*>(a), nvec, n);
    ST_CUDA_CHECK_LAUNCH(what);
  });
}

template <class Op>
void launch_binary(void* out, const void* a, const void* b, size_t n, DType dtype,
                   cudaStream_t stream, const char* what) {
  if (n == 0) return;
  dispatch_storage(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = kWide<T>;
    const size_t nvec = aligned16(out) && aligned16(a) && aligned16(b) ? n / V : 0;
    const unsigned grid = grid_for(nvec > 0 ? nvec : n, kThreads);
    cudak::launch(binary_kernel<T, V, Op>, grid, kThreads, 0, stream, static_cast<T*>(out),
                  static_cast<const T*>(a), static_cast<const T*>(b), nvec, n);
    ST_CUDA_CHECK_LAUNCH(what);
  });
}

// GELU backward with the column sums of its output over an (N, OC) view (the bias gradient
// of the GEMM whose output the GELU took). Block (chunk of kColChunk rows, tile of columns);
// each thread takes V consecutive columns and the chunk's rows in batches of kGeluRowBatch
// (the batch's loads first), computes dinp = round(GeluBackward(x, d)) as binary_kernel does,
// stores it, and adds the stored values into its columns' partials in row order: the bits of
// gelu_backward followed by colsum_accumulate's first pass (colsum_partial_kernel) on its
// output. Each element is read and then written by one thread, so dinp may alias an input.
constexpr int kGeluRowBatch = 4;
template <class T, int V>
__global__ void gelu_backward_colsum_kernel(T* dinp, float* part, const T* inp, const T* dout,
                                            int N, int OC) {
  const int chunk = blockIdx.x;
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * V;
  if (c >= OC) return;
  const int r0 = chunk * kColChunk;
  const int r1 = min(N, r0 + kColChunk);
  const GeluBackward op;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  for (int rb = r0; rb < r1; rb += kGeluRowBatch) {
    Vec<T, V> xv[kGeluRowBatch], dv[kGeluRowBatch];
#pragma unroll
    for (int u = 0; u < kGeluRowBatch; ++u) {
      if (rb + u < r1) {
        const size_t i = static_cast<size_t>(rb + u) * OC + c;
        xv[u] = load_vec<V>(inp + i);
        dv[u] = load_vec<V>(dout + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kGeluRowBatch; ++u) {
      if (rb + u < r1) {
        Vec<T, V> g;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          g.v[k] = from_float<T>(op(to_float(xv[u].v[k]), to_float(dv[u].v[k])));
          acc[k] += to_float(g.v[k]);
        }
        store_vec<V>(dinp + static_cast<size_t>(rb + u) * OC + c, g);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) part[static_cast<size_t>(chunk) * OC + c + k] = acc[k];
}

template <class T>
__global__ void round_inplace_kernel(float* x, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = to_float(from_float<T>(x[i]));
}

}  // namespace

void gelu_forward(void* out, const void* inp, size_t n, DType dtype, cudaStream_t stream) {
  launch_unary<GeluForward>(out, inp, n, dtype, stream, "gelu_forward_kernel");
}

void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dtype,
                   cudaStream_t stream) {
  launch_binary<GeluBackward>(dinp, inp, dout, n, dtype, stream, "gelu_backward_kernel");
}

void gelu_backward_dbias(void* dinp, void* dbias, const void* inp, const void* dout, int N,
                         int OC, DType dtype, float* scratch, cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  const unsigned chunks = static_cast<unsigned>((N + kColChunk - 1) / kColChunk);
  constexpr int kColThreads = 128;
  dispatch_storage(dtype, "gelu_backward_dbias", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kWide<T>;
    const bool wide = OC % W == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout);
    const int v = wide ? W : 1;
    const unsigned tiles = static_cast<unsigned>((OC / v + kColThreads - 1) / kColThreads);
    ST_CHECK(tiles <= 65535u, "gelu_backward_dbias: OC = ", OC, " is too wide");
    auto kernel = wide ? gelu_backward_colsum_kernel<T, W> : gelu_backward_colsum_kernel<T, 1>;
    cudak::launch(kernel, dim3(chunks, tiles), kColThreads, 0, stream, static_cast<T*>(dinp),
                  scratch, static_cast<const T*>(inp), static_cast<const T*>(dout), N, OC);
    ST_CUDA_CHECK_LAUNCH("gelu_backward_colsum_kernel");
  });
  colsum_finish(dbias, scratch, N, OC, dtype, stream);
}

void residual_forward(void* out, const void* a, const void* b, size_t n, DType dtype,
                      cudaStream_t stream) {
  launch_binary<Add>(out, a, b, n, dtype, stream, "residual_forward_kernel");
}

void round_inplace(float* x, size_t n, DType fmt, cudaStream_t stream) {
  if (n == 0 || fmt == DType::F32) return;
  const unsigned grid = grid_for(n, kThreads);
  if (fmt == DType::BF16) {
    cudak::launch(round_inplace_kernel<__nv_bfloat16>, grid, kThreads, 0, stream, x, n);
  } else if (fmt == DType::F16) {
    cudak::launch(round_inplace_kernel<__half>, grid, kThreads, 0, stream, x, n);
  } else {
    fail("CUDA round_inplace: format ", dtype_name(fmt), " (expected fp32, bf16 or fp16)");
  }
  ST_CUDA_CHECK_LAUNCH("round_inplace_kernel");
}

}  // namespace st::cudak
