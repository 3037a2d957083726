// AdamW (PyTorch's formulation), optim/adamw_cpu.cpp's arithmetic operation for operation:
//   g = grad * grad_scale; m = b1*m + (1-b1)*g; v = b2*v + ((1-b2)*g)*g
//   p = master * decay;  p = p - (step_size * m) / (sqrt(v) / bc2_sqrt + eps)
// with bc1, bc2_sqrt, step_size, decay computed on the host by the CPU's expressions
// (adamw_scalars). IEEE division and square root, no FMA contraction (--fmad=false): the
// master weights and moments are bit-identical to the CPU backend's; the compute copy gets
// round_fmt(p) (RNE), or, with stochastic rounding on, cuda/stochastic_round.h's rounding
// with the counter-based random bits of (seed, step, flat index), which a host
// implementation reproduces bit for bit. Grid-stride, 4 elements per thread and step (16-byte
// loads of master, m and v) when the pointers allow, else one.
#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/stochastic_round.h"

namespace st::cudak {
namespace {

struct DecodeBf16 {
  __device__ float operator()(uint16_t h) const {
    return __bfloat162float(__ushort_as_bfloat16(h));
  }
};
struct DecodeF16 {
  __device__ float operator()(uint16_t h) const { return __half2float(__ushort_as_half(h)); }
};

template <class T>
__device__ __forceinline__ T round_stochastic(float p, uint32_t r24);
template <>
__device__ __forceinline__ float round_stochastic<float>(float p, uint32_t) {
  return p;
}
template <>
__device__ __forceinline__ __nv_bfloat16 round_stochastic<__nv_bfloat16>(float p, uint32_t r24) {
  const uint16_t rne = __bfloat16_as_ushort(__float2bfloat16_rn(p));
  return __ushort_as_bfloat16(sr::stochastic_round(p, rne, r24, DecodeBf16{}));
}
template <>
__device__ __forceinline__ __half round_stochastic<__half>(float p, uint32_t r24) {
  const uint16_t rne = __half_as_ushort(__float2half_rn(p));
  return __ushort_as_half(sr::stochastic_round(p, rne, r24, DecodeF16{}));
}

// One element's update (the CPU's operations in the CPU's order).
template <class T, bool kStochastic>
__device__ __forceinline__ void adamw_element(float& master, T* param, T grad, float& m, float& v,
                                              const AdamWScalars& s, uint64_t seed,
                                              uint64_t step, uint64_t index) {
  const float g = to_float(grad) * s.grad_scale;
  const float mi = s.beta1 * m + (1.0f - s.beta1) * g;
  const float vi = s.beta2 * v + (1.0f - s.beta2) * g * g;
  m = mi;
  v = vi;
  float p = master * s.decay;
  p -= s.step_size * mi / (sqrtf(vi) / s.bc2_sqrt + s.eps);
  master = p;
  if (param) {
    if constexpr (kStochastic) {
      *param = round_stochastic<T>(p, sr::random24(seed, step, index));
    } else {
      *param = from_float<T>(p);
    }
  }
}

// V elements per thread and step of the grid-stride loop: master, m and v as 16-byte vectors
// (V = 4), grad and param as V-element vectors, when every pointer allows it (nvec > 0); the
// elements from nvec * V on, or all of them, one at a time. Elementwise: the same bits.
template <class T, bool kStochastic, int V>
__global__ void adamw_kernel(float* master, T* param, const T* grad, float* m, float* v, size_t n,
                             size_t nvec, AdamWScalars s, uint64_t seed, uint64_t step,
                             uint64_t index0) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t iv = tid; iv < nvec; iv += stride) {
    const size_t i = iv * V;
    Vec<float, V> mw = load_vec<V>(master + i), mm = load_vec<V>(m + i), vv = load_vec<V>(v + i);
    const Vec<T, V> gv = load_vec<V>(grad + i);
    Vec<T, V> pv;
#pragma unroll
    for (int k = 0; k < V; ++k)
      adamw_element<T, kStochastic>(mw.v[k], param ? &pv.v[k] : nullptr, gv.v[k], mm.v[k],
                                    vv.v[k], s, seed, step, index0 + i + k);
    store_vec<V>(master + i, mw);
    store_vec<V>(m + i, mm);
    store_vec<V>(v + i, vv);
    if (param) store_vec<V>(param + i, pv);
  }
  for (size_t i = nvec * V + tid; i < n; i += stride)
    adamw_element<T, kStochastic>(master[i], param ? param + i : nullptr, grad[i], m[i], v[i], s,
                                  seed, step, index0 + i);
}

}  // namespace

// The CPU's scalar expressions with T = float (optim/adamw_cpu.cpp).
AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float eps, float weight_decay,
                           int step, float grad_scale) {
  AdamWScalars s{};
  s.lr = lr;
  s.beta1 = beta1;
  s.beta2 = beta2;
  s.eps = eps;
  s.weight_decay = weight_decay;
  s.grad_scale = grad_scale;
  const float b1 = beta1, b2 = beta2;
  s.bc1 = 1.0f - std::pow(b1, static_cast<float>(step));
  s.bc2_sqrt = std::sqrt(1.0f - std::pow(b2, static_cast<float>(step)));
  s.step_size = lr / s.bc1;
  s.decay = 1.0f - lr * weight_decay;
  return s;
}

void adamw(float* master, void* param, const void* grad, float* m, float* v, size_t n,
           const AdamWScalars& s, DType dtype, bool stochastic, uint64_t seed, uint64_t step,
           uint64_t index0, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  constexpr int V = 4;
  auto aligned = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  dispatch_storage(dtype, "adamw", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto* p = static_cast<T*>(param);
    const auto* g = static_cast<const T*>(grad);
    const bool vec = aligned(master, 16) && aligned(m, 16) && aligned(v, 16) &&
                     aligned(g, V * sizeof(T)) && (!p || aligned(p, V * sizeof(T)));
    const size_t nvec = vec ? n / V : 0;
    const unsigned grid = grid_for(nvec > 0 ? nvec : n, kThreads);
    if (stochastic) {
      cudak::launch(adamw_kernel<T, true, V>, grid, kThreads, 0, stream, master, p, g, m, v, n,
                    nvec, s, seed, step, index0);
    } else {
      cudak::launch(adamw_kernel<T, false, V>, grid, kThreads, 0, stream, master, p, g, m, v, n,
                    nvec, s, seed, step, index0);
    }
    ST_CUDA_CHECK_LAUNCH("adamw_kernel");
  });
}

}  // namespace st::cudak
