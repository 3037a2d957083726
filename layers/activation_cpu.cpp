// Elementwise kernels: tanh-GELU forward/backward and the residual add, computed in T and
// rounded once on store. FP32's tanh is layers/vec_math.h's (vectorised, within 0.67 ulp);
// FP64's is libm's.
#include <cmath>

#include "layers/cpu_kernels.h"
#include "layers/vec_math.h"

namespace st::cpu {
namespace {
template <class T>
constexpr T kGeluScale = T(0.7978845608028654);  // sqrt(2/pi)

inline float tanh_t(float x) { return tanh_f32(x); }
inline double tanh_t(double x) { return std::tanh(x); }
}  // namespace

template <class T>
void gelu_forward(T* out, const T* inp, size_t n, DType fmt) {
  store_rounded(fmt, out, n, true, [&](size_t i) {
    const T x = inp[i];
    const T cube = T(0.044715) * x * x * x;
    return T(0.5) * x * (T(1) + tanh_t(kGeluScale<T> * (x + cube)));
  });
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, DType fmt) {
  store_rounded(fmt, dinp, n, true, [&](size_t i) {
    const T x = inp[i];
    const T cube = T(0.044715) * x * x * x;
    const T u = kGeluScale<T> * (x + cube);
    const T th = tanh_t(u);
    const T sech2 = T(1) - th * th;
    const T local = T(0.5) * (T(1) + th) +
                    x * T(0.5) * sech2 * kGeluScale<T> * (T(1) + T(3) * T(0.044715) * x * x);
    return local * dout[i];
  });
}

template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n, DType fmt) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = round_to(fmt, a[i] + b[i]);
}

#define INSTANTIATE(T)                                                     \
  template void gelu_forward<T>(T*, const T*, size_t, DType);              \
  template void gelu_backward<T>(T*, const T*, const T*, size_t, DType);   \
  template void residual_forward<T>(T*, const T*, const T*, size_t, DType);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace st::cpu
