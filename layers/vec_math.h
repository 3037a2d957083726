// exp and tanh for the FP32 CPU kernels, written so that GCC vectorises loops that call them
// (no calls, no branches: both sides of a select are computed; the files that use them are
// compiled with -fno-trapping-math, which lets the vectoriser if-convert the selects and
// changes no result). Evaluated in double and rounded once to float: within 0.501 ulp of
// the true value over every 61st float (tanh on [-20, 20], where glibc's tanhf errs by up to
// 2.1 ulp; exp over its whole float range), checked against libm in double by
// tests/test_vec_math.cpp. The FP64 reference mode keeps libm.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"

namespace st::cpu {

namespace vm_detail {
inline double bits_to_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}
inline uint64_t double_to_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}
}  // namespace vm_detail

// exp(t) in double for t in [-700, 700]: 2^n exp(r) with n = round(t / ln2), |r| <= ln2 / 2
// (ln2 split in two so n ln2 is exact), Taylor series of exp(r) to r^11 (truncation below
// 1e-14 relative).
inline double exp_f64_core(double t) {
  const double magic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const double nm = t * 1.4426950408889634 + magic;
  const double n = nm - magic;
  const double r = (t - n * 0.6931471803691238) - n * 1.9082149292705877e-10;
  double e = 1.0 / 39916800.0;
  e = e * r + 1.0 / 3628800.0;
  e = e * r + 1.0 / 362880.0;
  e = e * r + 1.0 / 40320.0;
  e = e * r + 1.0 / 5040.0;
  e = e * r + 1.0 / 720.0;
  e = e * r + 1.0 / 120.0;
  e = e * r + 1.0 / 24.0;
  e = e * r + 1.0 / 6.0;
  e = e * r + 0.5;
  e = e * r + 1.0;
  e = e * r + 1.0;
  // 2^n from n's bits: nm's low bits hold n (two's complement) after removing the magic.
  const uint64_t ni = vm_detail::double_to_bits(nm) - vm_detail::double_to_bits(magic);
  return e * vm_detail::bits_to_double((ni + 1023) << 52);
}

// exp of a float, rounded once to float. Arguments below -103 give 0 (float's smallest
// subnormal is 2^-149 ~ e^-103.3), above 88.8 give +inf, NaN gives NaN.
inline float exp_f32(float xf) {
  const double x = xf;
  const double t = x < -104.0 ? -104.0 : (x > 89.0 ? 89.0 : x);
  const double e = exp_f64_core(t);
  const double r = x < -104.0 ? 0.0 : e;
  return static_cast<float>(x != x ? x : r);
}

// tanh of a float: the odd Taylor series to x^13 below |x| = 0.25 (truncation below 1e-11
// relative), else 1 - 2 / (exp(2|x|) + 1) with the sign of x (|x| clamped at 20, where tanh
// is 1 in double).
inline float tanh_f32(float xf) {
  const double x = xf, a = x < 0 ? -x : x;
  const double xs = a < 0.25 ? x : 0.0, z = xs * xs;
  double s = 21844.0 / 6081075.0;
  s = s * z - 1382.0 / 155925.0;
  s = s * z + 62.0 / 2835.0;
  s = s * z - 17.0 / 315.0;
  s = s * z + 2.0 / 15.0;
  s = s * z - 1.0 / 3.0;
  s = s * z + 1.0;
  const double small = xs * s;
  const double t = a < 20.0 ? 2.0 * a : 40.0;
  const double mag = 1.0 - 2.0 / (exp_f64_core(t) + 1.0);
  const double big = x < 0 ? -mag : mag;
  return static_cast<float>(a < 0.25 ? small : (x != x ? x : big));
}

// out[i] = round_to(fmt, f(i)) for i in [0, n), over OpenMP threads when `threads` (a
// static schedule: elementwise, so the bits do not depend on the count). The format test is
// hoisted out of the loop so that the FP32 and BF16 loops vectorise.
template <class T, class F>
void store_rounded(DType fmt, T* out, size_t n, bool threads, F&& f) {
  if (std::is_same_v<T, double> || fmt == DType::F32) {
#pragma omp parallel for schedule(static) if (threads)
    for (size_t i = 0; i < n; ++i) out[i] = f(i);
  } else if (fmt == DType::BF16) {
#pragma omp parallel for schedule(static) if (threads)
    for (size_t i = 0; i < n; ++i) out[i] = round_to(DType::BF16, f(i));
  } else {
#pragma omp parallel for schedule(static) if (threads)
    for (size_t i = 0; i < n; ++i) out[i] = round_to(fmt, f(i));
  }
}

}  // namespace st::cpu
