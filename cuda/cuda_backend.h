// The CUDA backend (cuda_backend.cu) and the pieces it is built from: the storage-format
// conversion kernels (convert.cu) and the cuBLASLt GEMM (matmul.cu). Values are stored in
// their real format on the GPU (BF16/FP16 storage); arithmetic is FP32 and every stored
// result is rounded once, round-to-nearest-even, as on the CPU backend.
// Everything runs on the backend's one stream, in order.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "core/backend.h"

typedef struct cublasLtContext* cublasLtHandle_t;

namespace st {

// dst[i] = convert(src[i]) for i < n, on device pointers. Supported pairs: F32 -> BF16/F16
// (RNE, as __float2bfloat16_rn / __float2half_rn) and BF16/F16 -> F32 (exact).
// Throws naming both dtypes for any other pair.
void cuda_convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                  cudaStream_t stream);
bool cuda_can_convert(DType dst_dtype, DType src_dtype);

// Row-major GEMM on cuBLASLt: out (N,OC) = inp (N,C) . weight (OC,C)^T + bias (OC).
// dtype is the storage of all four operands: BF16/F16 (FP32 compute, one rounding at the
// store, bias added in FP32 by the epilogue) or F32 (plain FP32, no TF32).
// One plan (descriptors + algorithm) is cached per shape, dtype and pointer alignment.
class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  void run(void* out, const void* inp, const void* weight, const void* bias, int64_t N, int64_t C,
           int64_t OC, DType dtype, cudaStream_t stream);
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  struct Plan;
  // (m, n, k, dtype, has_bias, alignment of A, B, C/D, bias)
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, int, int, int, int>;
  Plan& plan(const Key& key, const void* bias);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;  // allocated once, shared by every call on the stream
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }
  DType storage_dtype(DType fmt) const override;
  Tensor alloc(const Shape& shape, DType storage) override;
  void zero(const Tensor& t) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void synchronize() override;

  void encoder_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, DType fmt) override;
  void encoder_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, DType fmt) override;
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& weight, const Tensor& bias,
                         DType fmt) override;
  void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, DType fmt) override;
  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, DType fmt) override;
  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       DType fmt) override;
  void gelu_forward(const Tensor& out, const Tensor& inp, DType fmt) override;
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, DType fmt) override;
  void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b, DType fmt) override;
  void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits,
                                     const Tensor& logits, const Tensor& targets, int V,
                                     float dloss, DType fmt) override;
  double sum_squares(const Tensor& t) override;
  bool all_finite(const Tensor& t) override;
  void adamw_update(const Tensor& master, const Tensor& param, const Tensor& grad, const Tensor& m,
                    const Tensor& v, const AdamWArgs& a, DType fmt) override;
  std::unique_ptr<Attention> make_attention(const AttentionConfig& cfg) override;

  // For benchmarks and tests that time or order work against the backend's stream.
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_index_; }

 private:
  void copy_convert(const Tensor& dst, const Tensor& src);

  int device_index_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LtGemm> gemm_;
};

}  // namespace st
