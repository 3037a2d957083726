// CPU kernels of the layers, one family per file (layers/*_cpu.cpp; attention's are in
// attention/attention_cpu.h, AdamW's in optim/adamw_cpu.h), with llm.c-style signatures:
// outputs first, then inputs, then sizes, then the format.
// Templated on the storage type T: float (FP32, and BF16/FP16 values held in FP32
// storage) or double (the FP64 reference mode). Arithmetic is done in T: FP32 as a GPU
// kernel does, with every stored result rounded once to `fmt` (round_to / round_inplace).
// Sums that the GPU reduces (bias and layernorm weight gradients, embedding scatter) are
// taken in a fixed order independent of the thread count, so results are deterministic.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace st::cpu {

template <class T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                     int C, DType fmt);
template <class T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_,
                      int C, DType fmt);

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C, DType fmt);
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int N, int C, DType fmt);

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                    DType fmt);
template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                     const T* weight, int N, int C, int OC, DType fmt);
// dbias (OC) = round(dbias + colsum(dout (N, OC))), each column's rows summed in order:
// matmul_backward's dbias.
template <class T>
void bias_backward(T* dbias, const T* dout, int N, int OC, DType fmt);

template <class T>
void gelu_forward(T* out, const T* inp, size_t n, DType fmt);
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, DType fmt);
template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n, DType fmt);

// losses (N); dlogits may be null or alias logits.
template <class T>
void crossentropy_forward_backward(T* losses, T* dlogits, const T* logits,
                                   const int32_t* targets, int N, int V, int Vp, float dloss,
                                   DType fmt);

template <class T>
double sum_squares(const T* x, size_t n);
template <class T>
bool all_finite(const T* x, size_t n);

}  // namespace st::cpu
