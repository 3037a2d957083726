#include "core/dtype.h"

#include <cmath>

#include "core/error.h"
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace st {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
  }
  fail("dtype_size: unknown dtype ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::F64: return "fp64";
    case DType::I32: return "int32";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp16" || s == "float16") return DType::F16;
  if (s == "fp64" || s == "float64") return DType::F64;
  fail("unknown precision '", s, "' (expected one of fp32, bf16, fp16, fp64)");
}

uint16_t float_to_fp16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;           // NaN: canonical, as CUDA
  if (a >= 0x477ff000u) return sign | 0x7c00u;   // >= 65520 (midpoint above 65504) and Inf
  if (a >= 0x38800000u) {                        // normal half: |f| >= 2^-14
    uint32_t h = (a - 0x38000000u) >> 13;        // rebias exponent 127 -> 15, keep 10 bits
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal half (or zero): the value in units of 2^-24 is below 2^10, so the
  // scaling is exact and nearbyint (default RNE mode) does the rounding; 0x400 is
  // the smallest normal, reached by carry.
  const float scaled = std::fabs(f) * 16777216.0f;
  return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
}

float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));  // Inf/NaN
  if (e == 0) {                                                       // zero/subnormal
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);     // exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

void round_inplace(DType t, float* x, size_t n) {
  if (t == DType::F32 || t == DType::F64) return;
  if (t == DType::BF16) {
#pragma omp parallel for simd schedule(static) if (parallel : n > (1u << 16))
    for (size_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, &x[i], 4);
      const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
      u = ((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
      u = nan ? 0x7fff0000u : u;
      std::memcpy(&x[i], &u, 4);
    }
    return;
  }
  if (t == DType::F16) {
#if defined(__F16C__)
    // Hardware VCVTPS2PH is IEEE RNE with subnormals; NaN payloads differ from
    // CUDA's canonical NaN, which only matters for bits, not for a NaN value.
    const size_t n8 = n / 8 * 8;
#pragma omp parallel for schedule(static) if (n > (1u << 16))
    for (size_t i = 0; i < n8; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
    }
    for (size_t i = n8; i < n; ++i) x[i] = round_fp16(x[i]);
#else
#pragma omp parallel for schedule(static) if (n > (1u << 16))
    for (size_t i = 0; i < n; ++i) x[i] = round_fp16(x[i]);
#endif
    return;
  }
}

void round_inplace(DType, double*, size_t) {}

void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > (1u << 16))
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16_bits(src[i]);
}
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > (1u << 16))
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}
void convert_f32_to_fp16(const float* src, uint16_t* dst, size_t n) {
#pragma omp parallel for schedule(static) if (n > (1u << 16))
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_fp16_bits(src[i]);
}
void convert_fp16_to_f32(const uint16_t* src, float* dst, size_t n) {
#pragma omp parallel for schedule(static) if (n > (1u << 16))
  for (size_t i = 0; i < n; ++i) dst[i] = fp16_bits_to_float(src[i]);
}

}  // namespace st
