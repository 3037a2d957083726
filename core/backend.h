// The backend interface: one method per kernel family. The GPT-2 model is written once as
// a sequence of these calls; the CPU backend (backends/cpu_backend.cpp, the executable
// specification) and the CUDA backend (cuda/cuda_backend.cu) implement them;
// backends/backends.h creates them.
//
// Conventions for every method:
//  - `fmt` is the numeric format of stored results. Results are computed in FP32 (FP64 in
//    the FP64 reference mode) and rounded once to fmt when stored (round-to-nearest-even).
//    On the CPU, BF16/FP16 values live in FP32 storage (see storage_dtype).
//  - Weights are stored (out, in), as in PyTorch and llm.c.
//  - "+=" outputs accumulate: dst = round_fmt(dst + contribution), contribution in FP32.
//  - Every method checks shapes and throws st::Error naming the argument.
#pragma once
#include <memory>
#include <string>

#include "core/attention.h"
#include "core/tensor.h"

namespace st {

struct AdamWArgs {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled; the caller passes 0 for tensors it does not decay
  int step = 1;               // 1-based, for bias correction
  float grad_scale = 1.0f;    // multiply the stored gradient by this (1/loss_scale * clip)
};

// Device memory of a backend (the CUDA arena); all zero on the CPU backend.
struct MemoryStats {
  size_t in_use = 0;    // bytes handed out and not yet released
  size_t peak = 0;      // largest in_use since creation or the last reset_peak_memory()
  size_t reserved = 0;  // bytes reserved from the driver
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // Storage dtype that holds values of logical format fmt on this backend.
  virtual DType storage_dtype(DType fmt) const = 0;
  virtual Tensor alloc(const Shape& shape, DType storage) = 0;
  virtual void zero(const Tensor& t) = 0;
  // dst <- src for equal numel, across devices and dtypes (converting with RNE).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // dst <- round_fmt(src): copy() plus rounding where dst's storage is wider than fmt
  // (the CPU's FP32 storage of BF16/FP16 values). Default: copy() (storage == fmt).
  virtual void round_copy(const Tensor& dst, const Tensor& src, DType fmt) { copy(dst, src); }
  virtual void synchronize() {}
  virtual MemoryStats memory() const { return {}; }
  virtual void reset_peak_memory() {}

  // out (B,T,C) = wte[tokens] + wpe[0:T]; tokens int32 (B,T) on the host.
  virtual void encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                               const Tensor& wpe, DType fmt) = 0;
  // dwte += scatter(dout), dwpe += sum over batch. Fixed summation order (deterministic).
  virtual void encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                const Tensor& tokens, DType fmt) = 0;
  // out (N,C) normalised, mean/rstd (N) in FP32.
  virtual void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                 DType fmt) = 0;
  // dinp += , dweight += , dbias += .
  virtual void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, DType fmt) = 0;
  // layernorm_backward, then dnext += colsum(dinp) of the dinp it leaves (bias_backward): the
  // bias gradient of the GEMM whose output is the gradient this layernorm adds into (the
  // residual stream's: attention and MLP projections), which the model then runs without
  // dbias. This default is the two calls (the CPU backend's); the CUDA backend sums dinp's
  // columns in the pass that writes it, with the bits of its own pair (cuda/layernorm.cu).
  virtual void layernorm_backward_dbias(const Tensor& dinp, const Tensor& dweight,
                                        const Tensor& dbias, const Tensor& dnext,
                                        const Tensor& dout, const Tensor& inp,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, DType fmt) {
    layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, fmt);
    bias_backward(dnext, dinp, fmt);
  }
  // out (N,OC) = inp (N,C) . weight(OC,C)^T + bias(OC); bias may be undefined.
  virtual void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias, DType fmt) = 0;
  // dinp = dout . weight (overwritten); dweight += dout^T . inp; dbias += colsum(dout).
  // In BF16/FP16 the product is rounded before it is added: dweight = round(dweight +
  // round(dout^T . inp)), as cuBLASLt does (layers/matmul_cpu.cpp).
  virtual void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                               const Tensor& dout, const Tensor& inp, const Tensor& weight,
                               DType fmt) = 0;
  // dbias (OC) += colsum(dout (N, OC)): matmul_backward's dbias alone, the same bits.
  virtual void bias_backward(const Tensor& dbias, const Tensor& dout, DType fmt) = 0;
  // tanh-approximation GELU.
  virtual void gelu_forward(const Tensor& out, const Tensor& inp, DType fmt) = 0;
  // dinp = dout * gelu'(inp) (overwritten; may alias dout).
  virtual void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout,
                             DType fmt) = 0;
  // gelu_backward, then dbias += colsum(dinp): the bias gradient of the GEMM whose output the
  // GELU took, which the model then runs without dbias. This default is the two calls
  // (gelu_backward, bias_backward; the CPU backend's); the CUDA backend sums the columns in
  // the pass that writes dinp, with the bits of its own pair (cuda/elementwise.cu).
  virtual void gelu_backward_dbias(const Tensor& dinp, const Tensor& dbias, const Tensor& inp,
                                   const Tensor& dout, DType fmt) {
    gelu_backward(dinp, inp, dout, fmt);
    bias_backward(dbias, dinp, fmt);
  }
  virtual void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b,
                                DType fmt) = 0;
  // res = a + b (residual_forward), then out, mean, rstd = layernorm of res
  // (layernorm_forward): the pair the model runs at every residual that feeds a layernorm.
  // This default is those two calls (the CPU backend's, so its bits are theirs); the CUDA
  // backend fuses them into one kernel with the same bits (cuda/layernorm.cu).
  virtual void residual_layernorm_forward(const Tensor& res, const Tensor& out,
                                          const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                          const Tensor& b, const Tensor& weight,
                                          const Tensor& bias, DType fmt) {
    residual_forward(res, a, b, fmt);
    layernorm_forward(out, mean, rstd, res, weight, bias, fmt);
  }
  // Fused classifier: logits (N,Vp), only the first V columns are real tokens.
  // losses (N) = -log softmax(logits)[target]; if dlogits is defined it receives
  // (softmax - onehot) * dloss, zero in the padded columns (may alias logits).
  virtual void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits,
                                             const Tensor& logits, const Tensor& targets, int V,
                                             float dloss, DType fmt) = 0;
  // Sum of squares in a fixed order, accumulated in FP64.
  virtual double sum_squares(const Tensor& t) = 0;
  virtual bool all_finite(const Tensor& t) = 0;
  // AdamW (PyTorch's formulation) on one flat range. master is FP32 (FP64 in the reference
  // mode) and is updated; when param is a different tensor it receives round_fmt(master).
  virtual void adamw_update(const Tensor& master, const Tensor& param, const Tensor& grad,
                            const Tensor& m, const Tensor& v, const AdamWArgs& a,
                            DType fmt) = 0;
  virtual std::unique_ptr<Attention> make_attention(const AttentionConfig& cfg) = 0;
};

}  // namespace st
