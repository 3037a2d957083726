// Launchers of the baseline attention's own kernels (cuda/attention_softmax.cu), on raw
// device pointers; the class in cuda/attention_baseline.cu calls them between its GEMMs.
// Layouts: heads (BH, T, ld) one row-major matrix per head (bh = b * NH + h); the packed
// tensors (B, T, row_stride); S/P and dP/dS (rows = BH * T, ld elements per row).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace st::cudak {

// dst (BH, T, ld) <- the columns [col0 + h*hs, col0 + (h+1)*hs) of each packed row.
void attn_split_heads(void* dst, const void* src, int B, int T, int NH, int hs, int64_t ld,
                      int64_t row_stride, int64_t col0, DType dtype, cudaStream_t stream);
// The inverse: the packed rows' columns [col0, col0 + NH*hs) <- src (BH, T, ld).
void attn_merge_heads(void* dst, const void* src, int B, int T, int NH, int hs, int64_t ld,
                      int64_t row_stride, int64_t col0, DType dtype, cudaStream_t stream);

// Per-row statistics (device arrays of rows), all null when collection is off.
struct SoftmaxRowStats {
  double* entropy = nullptr;
  float* max_logit = nullptr;
  int* tied = nullptr;   // 1 when another key is within tie_tol of the maximum
  int* p_one = nullptr;        // entries of P equal to 1
  int* p_tilde_one = nullptr;  // entries with round(exp(S - row max)) == 1 in P's format
};
// In place, one block per row: the row of S (row r = bh * T + t) becomes the row of P, lse
// (rows) receives m + log(sum). Causal rows see keys 0 .. t.
void softmax_forward(void* SP, float* lse, int64_t rows, int T, int64_t ld, bool causal,
                     const SoftmaxRowStats& st, double tie_tol, DType dtype, cudaStream_t stream);
// In place: the row of dP becomes the row of dS = P * (dP - rowsum(dP * P)).
void softmax_backward(void* dPS, const void* P, int64_t rows, int T, int64_t ld, bool causal,
                      DType dtype, cudaStream_t stream);

}  // namespace st::cudak
