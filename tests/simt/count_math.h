// Included first by the emulator's kernel translation units (tests/simt/CMakeLists.txt's
// wrappers): the FP32 transcendental functions the kernels call are counted per launch when
// simt::Options::count_traffic is set (LaunchTraffic::calls_*), for the cost model's
// arithmetic term. The values are glibc's, as without this header.
#pragma once
#include <cmath>

#include "simt/simt.h"

inline float simt_counted_expf(float x) {
  ::simt::count_math_call(0);
  return ::expf(x);
}
inline float simt_counted_logf(float x) {
  ::simt::count_math_call(1);
  return ::logf(x);
}
inline float simt_counted_tanhf(float x) {
  ::simt::count_math_call(2);
  return ::tanhf(x);
}
inline float simt_counted_exp2f(float x) {
  ::simt::count_math_call(3);
  return ::exp2f(x);
}
#define expf(x) simt_counted_expf(x)
#define logf(x) simt_counted_logf(x)
#define tanhf(x) simt_counted_tanhf(x)
#define exp2f(x) simt_counted_exp2f(x)
