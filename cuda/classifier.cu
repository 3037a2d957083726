// Fused classifier: softmax cross-entropy over the first V of Vp logit columns, without
// materialising the probabilities (layers/crossentropy_cpu.cpp's formulas):
//   mx = max_j<V x_j;  sum = sum_j<V exp(x_j - mx);  loss = log(sum) - (x_t - mx)  (FP32)
//   dlogits_j = round((exp(x_j - mx) * (1/sum) - [j == t]) * dloss) for j < V, 0 for j >= V.
// One block per row, three sweeps over the row (max, sum, write; the row stays in L1/L2).
// The sum is reduced in a fixed order (thread-strided partials, then block_sum's tree), so
// it is deterministic; against the CPU's sequential sum it differs by FP32 reassociation,
// and expf/logf may differ from glibc's in the last bit.
// dlogits may alias logits: x_t is read into a register before the first barrier, and
// in the write sweep each element is read and then written by the same thread, after
// barriers that every read of the first two sweeps precedes.
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace st::cudak {
namespace {

constexpr int kThreads = 512;

template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    crossentropy_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                        int Vtok, int Vp, float dloss) {
  ST_SHARED(float, smem, [32]);
  const int row = blockIdx.x;
  const T* x = logits + static_cast<size_t>(row) * Vp;
  const int t = targets[row];
  const float xt = threadIdx.x == 0 ? to_float(x[t]) : 0.0f;

  float mx = -INFINITY;
  for (int p = threadIdx.x; p * V < Vtok; p += kThreads) {
    const Vec<T, V> xv = load_vec<V>(x + p * V);
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (p * V + k < Vtok) mx = fmaxf(mx, to_float(xv.v[k]));
  }
  mx = block_max(mx, smem);

  float sum = 0.0f;
  for (int p = threadIdx.x; p * V < Vtok; p += kThreads) {
    const Vec<T, V> xv = load_vec<V>(x + p * V);
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (p * V + k < Vtok) sum += expf(to_float(xv.v[k]) - mx);
  }
  sum = block_sum(sum, smem);
  if (threadIdx.x == 0) losses[row] = logf(sum) - (xt - mx);
  if (!dlogits) return;

  const float inv = 1.0f / sum;
  T* d = dlogits + static_cast<size_t>(row) * Vp;
  for (int p = threadIdx.x; p * V < Vp; p += kThreads) {
    const Vec<T, V> xv = load_vec<V>(x + p * V);
    Vec<T, V> dv;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int j = p * V + k;
      float g = 0.0f;
      if (j < Vtok) {
        const float prob = expf(to_float(xv.v[k]) - mx) * inv;
        g = (prob - (j == t ? 1.0f : 0.0f)) * dloss;
      }
      dv.v[k] = from_float<T>(g);
    }
    store_vec<V>(d + p * V, dv);
  }
}

}  // namespace

void crossentropy(float* losses, void* dlogits, const void* logits, const int32_t* targets, int N,
                  int V, int Vp, float dloss, DType dtype, cudaStream_t stream) {
  if (N == 0) return;
  dispatch_storage(dtype, "crossentropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kWide<T>;
    const bool wide =
        Vp % W == 0 && aligned16(logits) && (dlogits == nullptr || aligned16(dlogits));
    auto* d = static_cast<T*>(dlogits);
    const auto* x = static_cast<const T*>(logits);
    if (wide) {
      cudak::launch(crossentropy_kernel<T, W>, static_cast<unsigned>(N), kThreads, 0, stream,
                    losses, d, x, targets, V, Vp, dloss);
    } else {
      cudak::launch(crossentropy_kernel<T, 1>, static_cast<unsigned>(N), kThreads, 0, stream,
                    losses, d, x, targets, V, Vp, dloss);
    }
    ST_CUDA_CHECK_LAUNCH("crossentropy_kernel");
  });
}

}  // namespace st::cudak
