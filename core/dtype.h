// Numeric formats and round-to-nearest-even conversions.
// float -> bf16/fp16 are bit-identical to CUDA's __float2bfloat16_rn / __float2half_rn
// (NaN -> the canonical 0x7FFF, overflow -> Inf, subnormals kept), which
// tests/test_dtype_exhaustive.cpp checks against the CUDA headers over all 2^32 inputs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace st {

// F64 exists so the CPU backend can run the whole model as an FP64 reference.
// I32 is for token ids only (not a compute format).
enum class DType { F32, BF16, F16, F64, I32 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "fp32", "bf16", "fp16", "fp64"
DType parse_dtype(const std::string& s);  // throws naming the accepted spellings

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN: canonical, as CUDA
  // Adding 0x7fff plus the kept LSB carries into bit 16 exactly when the
  // dropped half is above the midpoint, or at it with an odd kept part.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_fp16_bits(float f);
float fp16_bits_to_float(uint16_t h);

// Value-to-value rounding: the nearest representable value, returned as float.
inline float round_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }
inline float round_fp16(float f) { return fp16_bits_to_float(float_to_fp16_bits(f)); }

// Round n values in place to format t (no-op for F32/F64). Threaded, vectorised.
void round_inplace(DType t, float* x, size_t n);
inline float round_to(DType t, float f) {
  return t == DType::BF16 ? round_bf16(f) : t == DType::F16 ? round_fp16(f) : f;
}
inline double round_to(DType, double f) { return f; }  // FP64 storage is never rounded
void round_inplace(DType t, double* x, size_t n);      // no-op; for templated callers

// Bulk conversions between storage formats (RNE).
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_fp16(const float* src, uint16_t* dst, size_t n);
void convert_fp16_to_f32(const uint16_t* src, float* dst, size_t n);

}  // namespace st
