// Stochastic rounding of FP32 to BF16/FP16 with a counter-based random stream, written once
// for the host and the device so a CPU reference reproduces the GPU bit for bit.
//
// The random bits for element `index` of optimizer step `step` under seed `seed` are
//   random24(seed, step, index) = splitmix64(splitmix64(seed ^ splitmix64(step)) + index) >> 40
// (24 bits): no state, so a resumed run (same seed, same step counter, same flat parameter
// offsets) draws exactly the numbers an uninterrupted run draws.
//
// stochastic_round(x, rne, r24, decode): x finite and not representable lies between two
// neighbours in the 16-bit format, lo (toward zero) and hi (away from zero); the result is
// hi with probability (|x| - |lo|) / (|hi| - |lo|), decided by r24 * 2^-24 < that fraction.
// Every step of the arithmetic is exact in FP32 (the difference of x and its truncation,
// a power-of-two gap), so host and device agree bit for bit. NaN, Inf and representable
// values return the round-to-nearest-even bits `rne` unchanged; a value beyond the largest
// finite number rounds to that number, never to Inf (the gap to Inf is infinite).
// rne must be x rounded to nearest even in the format (core/dtype.h on the host, the
// __float2*_rn intrinsics on the device), decode the exact 16-bit -> float widening.
#pragma once
#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define ST_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ST_HOST_DEVICE inline
#endif

namespace st::sr {

ST_HOST_DEVICE uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

ST_HOST_DEVICE uint32_t random24(uint64_t seed, uint64_t step, uint64_t index) {
  return static_cast<uint32_t>(splitmix64(splitmix64(seed ^ splitmix64(step)) + index) >> 40);
}

template <class Decode>
ST_HOST_DEVICE uint16_t stochastic_round(float x, uint16_t rne, uint32_t r24, Decode decode) {
  const float ax = fabsf(x);
  const float near = decode(rne);
  if (!(ax <= 3.402823466e38f) || near == x) return rne;  // NaN, Inf, or representable
  const uint16_t sign = static_cast<uint16_t>(rne & 0x8000u);
  const uint16_t mag = static_cast<uint16_t>(rne & 0x7fffu);
  uint16_t lo, hi;
  if (fabsf(near) > ax) {  // rounded away from zero: near is hi (mag >= 1 since near != 0)
    hi = rne;
    lo = static_cast<uint16_t>(sign | (mag - 1u));
  } else {
    lo = rne;
    hi = static_cast<uint16_t>(sign | (mag + 1u));  // may be the Inf pattern
  }
  const float flo = fabsf(decode(lo));
  const float fhi = fabsf(decode(hi));
  const float frac = (ax - flo) / (fhi - flo);  // exact; 0 when hi is Inf
  return static_cast<float>(r24) * 5.9604644775390625e-8f < frac ? hi : lo;  // 2^-24
}

}  // namespace st::sr
