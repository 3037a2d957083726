// Host-side launchers of the CUDA backend's kernels (one .cu file per family). CudaBackend
// (cuda_backend_kernels.cu) checks shapes, dtypes and aliasing, then calls these with raw device
// pointers. `dtype` is the storage of the compute-format operands (F32, BF16 or F16); FP32
// statistics (layernorm mean/rstd, losses), master weights and Adam moments are float*.
// Every launcher enqueues on `stream` and checks the launch; none synchronizes.
//
// Rounding: each kernel computes in FP32 and rounds each stored result once (RNE), at the
// points the CPU backend rounds (layers/*_cpu.cpp): see the top of each .cu file.
// Determinism: no floating-point atomics anywhere; every sum has a fixed order that depends
// only on the sizes (and, for the vector paths, on pointer alignment), so repeated calls on
// the same inputs give bit-identical results.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace st::cudak {

// ---- encoder.cu ----
// out (B,T,C) = round(wte[tokens] + wpe[t]); tokens: device int32 (B*T).
void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                     int T, int C, DType dtype, cudaStream_t stream);
// dwte[token] += sum of the dout rows of that token, in (b, t) order; dwpe[t] += sum over b.
// tokens: device int32 (B*T), each in [0, rows) (rows: dwte's row count). The grouping is a
// stable radix sort on the device (no host work, no synchronization); scratch:
// encoder_backward_scratch(B*T) int32 of device memory.
size_t encoder_backward_scratch(int n);
void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                      int C, int rows, DType dtype, int32_t* scratch, cudaStream_t stream);

// ---- layernorm.cu ----
void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                       const void* bias, int N, int C, DType dtype, cudaStream_t stream);
// res = round(a + b) (residual_forward), then layernorm_forward(out, mean, rstd, res, ...): one
// kernel, bit-identical to the two. res may be a or b (each thread reads its elements of a and
// b before it writes them to res; the later passes read res only); it must not overlap out,
// mean or rstd.
void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                const void* b, const void* weight, const void* bias, int N, int C,
                                DType dtype, cudaStream_t stream);
// dinp += , dweight += , dbias += ; with dnext (may be null) also dnext[j] = round(dnext[j] +
// colsum(dinp)[j]) of the dinp it leaves: the bits of colsum_accumulate(dnext, dinp) after the
// call. Scratch: layernorm_backward_scratch(N, C) floats of device memory.
size_t layernorm_backward_scratch(int N, int C);
void layernorm_backward(void* dinp, void* dweight, void* dbias, void* dnext, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int N, int C, DType dtype, float* scratch, cudaStream_t stream);

// ---- reduce.cu ----
// Rows per chunk of the two-pass column sums (dbias, layernorm dweight/dbias): each chunk's
// rows are summed in row order, then the chunk sums in chunk order. With N <= kColChunk
// rows that is exactly the CPU's row-order sum.
constexpr int kColChunk = 64;
// dbias[j] = round(dbias[j] + sum_i dout[i][j]); scratch: colsum_scratch(N, OC) floats.
size_t colsum_scratch(int N, int OC);
void colsum_accumulate(void* dbias, const void* dout, int N, int OC, DType dtype, float* scratch,
                       cudaStream_t stream);
// colsum_accumulate's second pass alone: dbias[j] = round(dbias[j] + the chunk partials
// part[k][j] summed in chunk order), part as colsum_accumulate's first pass writes it.
void colsum_finish(void* dbias, const float* part, int N, int OC, DType dtype,
                   cudaStream_t stream);
// Sum of squares accumulated in FP64: chunks of kSumChunk elements (a fixed tree inside
// each), then the chunk sums in chunk order (as the CPU). *result (device) receives it.
constexpr size_t kSumChunk = size_t{1} << 16;
size_t sum_squares_scratch(size_t n);  // doubles
void sum_squares(double* result, const void* x, size_t n, DType dtype, double* scratch,
                 cudaStream_t stream);
// *flag (device int, zeroed by the caller) becomes 1 if any element is Inf or NaN.
void any_nonfinite(int* flag, const void* x, size_t n, DType dtype, cudaStream_t stream);

// ---- elementwise.cu ----
void gelu_forward(void* out, const void* inp, size_t n, DType dtype, cudaStream_t stream);
// dinp may alias dout or inp.
void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n, DType dtype,
                   cudaStream_t stream);
// gelu_backward over an (N, OC) view and dbias[j] = round(dbias[j] + colsum(dinp)[j]): the
// bits of gelu_backward then colsum_accumulate of its output, in one pass that writes dinp
// and sums it. dinp may alias dout or inp. scratch: colsum_scratch(N, OC) floats.
void gelu_backward_dbias(void* dinp, void* dbias, const void* inp, const void* dout, int N,
                         int OC, DType dtype, float* scratch, cudaStream_t stream);
void residual_forward(void* out, const void* a, const void* b, size_t n, DType dtype,
                      cudaStream_t stream);
// x[i] = round_fmt(x[i]) in place on FP32 storage (fmt BF16 or F16; F32 is a no-op).
void round_inplace(float* x, size_t n, DType fmt, cudaStream_t stream);

// ---- classifier.cu ----
// One block per row; dlogits may be null or alias logits.
void crossentropy(float* losses, void* dlogits, const void* logits, const int32_t* targets, int N,
                  int V, int Vp, float dloss, DType dtype, cudaStream_t stream);

// ---- adamw.cu ----
// Scalars computed on the host exactly as the CPU's optim/adamw_cpu.cpp computes them.
struct AdamWScalars {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bc1, bc2_sqrt, step_size, decay;
};
AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float eps, float weight_decay,
                           int step, float grad_scale);
// param may be null (it is master itself). stochastic: round param stochastically with
// st::sr::random24(seed, step, index0 + i) (cuda/stochastic_round.h) instead of RNE.
void adamw(float* master, void* param, const void* grad, float* m, float* v, size_t n,
           const AdamWScalars& s, DType dtype, bool stochastic, uint64_t seed, uint64_t step,
           uint64_t index0, cudaStream_t stream);

}  // namespace st::cudak
