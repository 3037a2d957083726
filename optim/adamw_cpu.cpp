// AdamW in PyTorch's formulation (torch.optim.AdamW, foreach=False):
//   g = grad * grad_scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2
//   p = p*(1 - lr*wd);  p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
// master, m, v in FP32 (FP64 in the reference mode); the compute copy gets round_fmt(p).
#include <cmath>

#include "optim/adamw_cpu.h"

namespace st::cpu {

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
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T g = grad[i] * gs;
    const T mi = b1 * m[i] + (T(1) - b1) * g;
    const T vi = b2 * v[i] + (T(1) - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    T p = master[i] * decay;
    p -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + T(eps));
    master[i] = p;
    if (param) param[i] = round_to(fmt, p);
  }
}

template void adamw_update<float>(float*, float*, const float*, float*, float*, size_t, float,
                                  float, float, float, float, int, float, DType);
template void adamw_update<double>(double*, double*, const double*, double*, double*, size_t,
                                   float, float, float, float, float, int, float, DType);

}  // namespace st::cpu
