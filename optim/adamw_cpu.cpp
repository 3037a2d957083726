// AdamW in PyTorch's formulation (torch.optim.AdamW, foreach=False):
//   g = grad * grad_scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2
//   p = p*(1 - lr*wd);  p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
// master, m, v in FP32 (FP64 in the reference mode); the compute copy gets round_fmt(p).
#include <cmath>
#include <type_traits>

#include "optim/adamw_cpu.h"

namespace st::cpu {

namespace {

// What the loop stores beside the master weight: nothing, the same value, or the value
// rounded to BF16/FP16. A template argument, so that the loop has no branch and vectorises
// (with -fno-math-errno for sqrt, set for this file in CMakeLists.txt; v >= 0, so no result
// changes).
enum class Store { None, Copy, BF16, FP16 };

template <class T, Store S>
void update(T* master, T* param, const T* grad, T* m, T* v, size_t n, T b1, T b2, T eps,
            T bc2_sqrt, T step_size, T decay, T gs) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T g = grad[i] * gs;
    const T mi = b1 * m[i] + (T(1) - b1) * g;
    const T vi = b2 * v[i] + (T(1) - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    T p = master[i] * decay;
    p -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    master[i] = p;
    if constexpr (S == Store::Copy) param[i] = p;
    if constexpr (S == Store::BF16) param[i] = round_to(DType::BF16, p);
    if constexpr (S == Store::FP16) param[i] = round_to(DType::F16, p);
  }
}

}  // namespace

template <class T>
void adamw_update(T* master, T* param, const T* grad, T* m, T* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, DType fmt) {
  const T b1 = beta1, b2 = beta2;
  const T bc1 = T(1) - std::pow(b1, T(step));
  const T bc2_sqrt = std::sqrt(T(1) - std::pow(b2, T(step)));
  const T step_size = T(lr) / bc1;
  const T decay = T(1) - T(lr) * T(weight_decay);
  const T gs = grad_scale;
  const auto run = [&](auto store) {
    update<T, decltype(store)::value>(master, param, grad, m, v, n, b1, b2, T(eps), bc2_sqrt,
                                      step_size, decay, gs);
  };
  const bool narrow = std::is_same_v<T, float> && (fmt == DType::BF16 || fmt == DType::F16);
  if (!param)
    run(std::integral_constant<Store, Store::None>{});
  else if (!narrow)
    run(std::integral_constant<Store, Store::Copy>{});
  else if (fmt == DType::BF16)
    run(std::integral_constant<Store, Store::BF16>{});
  else
    run(std::integral_constant<Store, Store::FP16>{});
}

template void adamw_update<float>(float*, float*, const float*, float*, float*, size_t, float,
                                  float, float, float, float, int, float, DType);
template void adamw_update<double>(double*, double*, const double*, double*, double*, size_t,
                                   float, float, float, float, float, int, float, DType);

}  // namespace st::cpu
