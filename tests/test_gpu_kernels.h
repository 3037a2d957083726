// The parts of the GPU kernel tests (test_gpu_kernels.cpp: conversions and the GEMM;
// test_gpu_kernels_cases.cpp: the parity table's cases; test_gpu_kernels_parity.cpp: the
// parity, determinism, stochastic rounding and arena tests; one executable, label gpu) that
// several files use: the Gpu fixture and the parity table's types (what one case is: its
// tensors, their initialisation and tolerance, the method run on both backends).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda/cuda_backend.h"
#include "gpu_test_util.h"

namespace st::gpu_kernels {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    require_gpu();
    if (HasFatalFailure()) return;
    be_ = make_cuda_backend(0);
  }

  Tensor to_device(const Tensor& host) {
    Tensor d = be_->alloc(host.shape(), host.dtype());
    be_->copy(d, host);
    return d;
  }
  Tensor to_host(const Tensor& dev) {
    Tensor h = Tensor::empty(dev.shape(), dev.dtype());
    be_->copy(h, dev);
    return h;
  }
  Tensor poisoned_device(const Shape& shape, DType dtype) {
    Tensor h = Tensor::empty(shape, dtype);
    std::memset(h.raw(), 0xAB, h.nbytes());
    return to_device(h);
  }

  std::unique_ptr<Backend> be_;
};

// One ulp of fmt at |x| (subnormal spacing below the smallest normal).
inline double ulp_of(DType fmt, double x) {
  const int e = x == 0 ? -1000 : std::ilogb(x);
  if (fmt == DType::BF16) return std::ldexp(1.0, std::max(e, -126) - 7);
  if (fmt == DType::F16) return std::ldexp(1.0, std::max(e, -14) - 10);
  return std::ldexp(1.0, std::max(e, -126) - 23);
}

// ---------------------------------------------------------------- the parity table's types

enum class Kind { Act, F32 };           // compute-format storage on the GPU / FP32 on both
enum class Init { In, Poison, Accum };  // input / overwritten output / "+=" output

struct Tol {
  bool exact = true;
  double ulps_low = 0, ulps_f32 = 0;  // ulps of the output's format: bf16/fp16, or FP32
  double floor = 0;                   // times max|cpu| over the output
  // += outputs whose added term is rounded before the addition (dweight): that term may
  // round to a neighbour on one side, which moves the result by one ulp of the term.
  double addend_ulps = 0;  // ulps of the output's format at |cpu - initial value|
  double max_differ = 1;   // the largest fraction of elements that may differ at all
};
// Bit-identical: the kernel does the CPU's operations in the CPU's order.
inline constexpr Tol kExact{};
inline constexpr Tol close_to(double ulps_low, double ulps_f32, double floor) {
  return Tol{false, ulps_low, ulps_f32, floor};
}

struct Spec {
  std::string name;
  Shape shape;
  Kind kind = Kind::Act;
  Init init = Init::In;
  double scale = 1.0, shift = 0.0;
  bool positive = false;
  Tol tol = kExact;
  bool nonzero = true;   // the output's norm must be > 0 (false for zero())
  bool planted = false;  // an input the case itself changes before the call (all_finite)
};

using RunFn = std::function<std::vector<double>(Backend&, const std::vector<Tensor>&,
                                                const Tensor& ints, DType fmt)>;

struct Case {
  std::string method, variant;
  std::vector<Spec> specs;
  Shape ints_shape;        // host int32 tokens / targets; empty: none
  int64_t ints_range = 0;  // drawn from [0, ints_range)
  bool gemm = false;       // cuBLASLt operands: placed at the config's gemm offset
  RunFn run;
  double scalar_rel = 0;  // tolerance of the returned scalars (relative; 0: exact)
};

struct Cfg {
  const char* name;
  int64_t B, T, C, rows, maxT, OC, cls_rows, V, Vp;
  int64_t offset, gemm_offset;  // elements before each GPU view (1: misaligned)
};
// Odd sizes and misaligned views (scalar kernel paths, tails), GPT-2 124M widths with
// aligned views (128-bit paths, the real vocabulary), and a larger one for determinism.
inline const Cfg kOdd{"odd", 3, 37, 100, 67, 40, 300, 111, 997, 1001, 1, 8};
inline const Cfg kGpt2{"gpt2", 4, 64, 768, 1024, 64, 2304, 64, 50257, 50304, 0, 0};
inline const Cfg kLarge{"large", 8, 256, 768, 4096, 256, 2304, 64, 50257, 50304, 0, 0};

// The table: every Backend method's cases at sizes z in format fmt (test_gpu_kernels_cases.cpp).
std::vector<Case> make_cases(const Cfg& z, DType fmt);

}  // namespace st::gpu_kernels
