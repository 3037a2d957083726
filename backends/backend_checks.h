// Operand checks the CPU backend (backends/cpu_backend.cpp) and the CUDA backend
// (cuda/cuda_backend_kernels.cu) share, so both refuse the same operands in the same words.
// Each backend adds its own device and storage checks around them.
#pragma once
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"

namespace st {

// v as a kernel's int size; refuses what does not fit.
inline int to_int(int64_t v, const char* what) {
  ST_CHECK(v >= 0 && v <= INT32_MAX, what, " = ", v, " does not fit in int");
  return static_cast<int>(v);
}

// Every token id of the host int32 tensor `tokens` indexes a row of an embedding table of
// vocab_rows rows.
inline void check_token_ids(const Tensor& tokens, int64_t vocab_rows) {
  const int32_t* tk = static_cast<const int32_t*>(tokens.raw());
  for (int64_t i = 0; i < tokens.numel(); ++i)
    ST_CHECK(tk[i] >= 0 && tk[i] < vocab_rows, "token id ", tk[i], " at position ", i,
             " is outside the embedding table of ", vocab_rows, " rows");
}

// layernorm_forward's shapes: out as inp, N rows of C = inp's last dimension; weight and bias
// (C); mean and rstd N elements. Returns {N, C}.
inline std::pair<int64_t, int64_t> check_layernorm_shapes(const Tensor& out, const Tensor& mean,
                                                          const Tensor& rstd, const Tensor& inp,
                                                          const Tensor& weight,
                                                          const Tensor& bias) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  check_same(out, inp, "layernorm out vs inp");
  check_shape(weight, {C}, "layernorm weight");
  check_shape(bias, {C}, "layernorm bias");
  ST_CHECK(mean.numel() == N && rstd.numel() == N, "layernorm: mean/rstd need ", N,
           " elements, got ", mean.desc(), ", ", rstd.desc());
  return {N, C};
}

}  // namespace st
