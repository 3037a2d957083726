// The SIMT emulator's number formats (simt.h, the __double2float_r* intrinsics and "16-bit
// formats"): FP64 -> FP32 in the four rounding modes, FP32 -> bf16 / fp16 rounded to nearest
// even, fp16 -> FP32. Written from the IEEE definitions, not from core/dtype.h, so that the
// tests comparing the emulated kernels with the CPU backend compare two implementations.
#include <cfloat>
#include <cmath>

#include "simt/simt.h"

namespace simt {

float double_to_float(double x, int mode) {
  const float f = static_cast<float>(x);  // round to nearest even
  if (mode == 0 || std::isnan(x) || static_cast<double>(f) == x) return f;
  if (std::isinf(f)) {  // finite x beyond FLT_MAX
    const bool pos = x > 0;
    if (mode == 1) return pos ? FLT_MAX : -FLT_MAX;
    if (mode == 2) return pos ? f : -FLT_MAX;
    return pos ? FLT_MAX : f;
  }
  const bool above = static_cast<double>(f) > x;
  if (mode == 1) {  // toward zero
    if (x > 0 && above) return std::nextafter(f, 0.0f);
    if (x < 0 && !above) return std::nextafter(f, 0.0f);
    return f;
  }
  if (mode == 2) return above ? f : std::nextafter(f, INFINITY);
  return above ? std::nextafter(f, -INFINITY) : f;
}

uint16_t f32_to_bf16_rn(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN: CUDA's canonical bf16 NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t f32_to_f16_rn(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fff;           // NaN: CUDA's canonical fp16 NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (and Inf) -> Inf
  if (a >= 0x38800000u) {                       // normal fp16 (>= 2^-14)
    const uint32_t mant = a & 0x7fffffu;
    const uint32_t e = (a >> 23) - 127 + 15;
    uint32_t h = (e << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: rounds to (signed) zero
  const uint64_t m = (a & 0x7fffffu) | 0x800000u;
  const int s = 126 - static_cast<int>(a >> 23);  // value / 2^-24 = m >> s
  uint64_t h = m >> s;
  const uint64_t rem = m & ((uint64_t{1} << s) - 1), half = uint64_t{1} << (s - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;  // exact
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e - 15 + 127) << 23) | (m << 13));
}

}  // namespace simt
