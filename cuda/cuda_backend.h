// The CUDA backend (cuda_backend.cu) and the pieces it is built from: the device memory
// arena (arena.h), the storage-format conversion kernels (convert.cu), the cuBLASLt GEMMs
// (matmul.cu) and one kernel family per file (kernels.h lists them). Values are stored in
// their real format on the GPU (BF16/FP16 storage); arithmetic is FP32 and every stored
// result is rounded once, round-to-nearest-even, at the CPU backend's points.
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
#include "cuda/arena.h"

typedef struct cublasLtContext* cublasLtHandle_t;

namespace st {

// dst[i] = convert(src[i]) for i < n, on device pointers. Supported pairs: F32 -> BF16/F16
// (RNE, as __float2bfloat16_rn / __float2half_rn) and BF16/F16 -> F32 (exact).
// Throws naming both dtypes for any other pair.
void cuda_convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                  cudaStream_t stream);
bool cuda_can_convert(DType dst_dtype, DType src_dtype);

// One cuBLASLt GEMM in column-major terms: D (m,n) = alpha * op(A) (m,k) . op(B) (k,n)
// [+ bias (m)] [+ D when beta = 1]. All operands in storage `dtype`; FP32 compute. See
// matmul.cu. Strided-batched when batch > 1: product i reads A + i * stride_a, B + i *
// stride_b and writes D + i * stride_d (strides in elements; no bias then).
struct GemmOp {
  bool transa = false, transb = false;
  int64_t m = 0, n = 0, k = 0;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* D = nullptr;
  int64_t ldd = 0;
  float alpha = 1.0f;  // scales the FP32 product before the store's one rounding
  float beta = 0.0f;   // 0 (overwrite) or 1 (accumulate into D)
  const void* bias = nullptr;
  DType dtype = DType::BF16;
  int64_t batch = 1;  // number of products (strided-batched when > 1)
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
};

// Row-major GEMMs on cuBLASLt (matmul.cu): the forward out (N,OC) = inp (N,C) .
// weight (OC,C)^T + bias (OC) and the two backward products. dtype is the storage of every
// operand: BF16/F16 (FP32 compute, one rounding at the store, bias and beta*C added in FP32)
// or F32 (plain FP32, no TF32). One plan (descriptors + algorithm) is cached per shape,
// transposes, dtype, beta, batch count and strides, and pointer alignment (alpha is a
// runtime argument of every call, not part of a plan).
class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  void matmul(const GemmOp& op, cudaStream_t stream);
  // out (N,OC) = inp (N,C) . weight (OC,C)^T + bias (OC); bias may be null.
  void run(void* out, const void* inp, const void* weight, const void* bias, int64_t N, int64_t C,
           int64_t OC, DType dtype, cudaStream_t stream);
  // dinp (N,C) = dout (N,OC) . weight (OC,C), overwritten.
  void backward_dinp(void* dinp, const void* dout, const void* weight, int64_t N, int64_t C,
                     int64_t OC, DType dtype, cudaStream_t stream);
  // dweight (OC,C) = round(dweight + round(dout^T . inp)) for BF16/FP16, whatever algorithm
  // cuBLASLt picks: the product goes to `product` (OC*C elements of dtype, not dweight) by a
  // beta = 0 GEMM, then one add rounds the sum (matmul.cu, "Rounding"); FP32: dweight +=
  // dout^T . inp by one beta = 1 GEMM (product unused, may be null).
  void backward_dweight(void* dweight, void* product, const void* dout, const void* inp,
                        int64_t N, int64_t C, int64_t OC, DType dtype, cudaStream_t stream);
  // The GEMM D (OC,C) = dout^T . inp [+ D when beta = 1]; backward_dweight runs it with
  // D = product, beta = 0 (BF16/FP16) or D = dweight, beta = 1 (FP32).
  static GemmOp dweight_op(void* D, const void* dout, const void* inp, int64_t N, int64_t C,
                           int64_t OC, DType dtype, float beta);
  size_t workspace_bytes() const { return workspace_bytes_; }
  // The algorithm cuBLASLt chose for g's plan: "algo A tile T stages S splitK K reduction R
  // ..." (planning it if needed; nothing is computed).
  std::string describe(const GemmOp& g);

 private:
  struct Plan;
  // (transa, transb, m, n, k, lda, ldb, ldd, dtype, has_bias, accumulate, alignment of A, B,
  // C/D, bias, batch, stride_a, stride_b, stride_d); the alignments of a batched operand
  // hold for every product (the pointer's and the stride's in bytes).
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                         bool, bool, int, int, int, int, int64_t, int64_t, int64_t, int64_t>;
  Plan& plan(const Key& key, const void* bias);
  Key key_of(const GemmOp& g) const;

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;  // allocated once, shared by every call on the stream
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

// A kernel's operand: defined, on the GPU, in storage dtype, its pointer align-byte aligned;
// otherwise one line "<who>: <what> <desc> must ...".
void check_device_tensor(const Tensor& t, DType dtype, const char* who, const char* what,
                         size_t align);

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return name_; }
  DType storage_dtype(DType fmt) const override;
  // Device memory from the arena (arena.h): no cudaMalloc once the arena holds enough.
  Tensor alloc(const Shape& shape, DType storage) override;
  void zero(const Tensor& t) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void round_copy(const Tensor& dst, const Tensor& src, DType fmt) override;
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
  void layernorm_backward_dbias(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                const Tensor& dnext, const Tensor& dout, const Tensor& inp,
                                const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                DType fmt) override;
  void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, DType fmt) override;
  void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       DType fmt) override;
  void gelu_forward(const Tensor& out, const Tensor& inp, DType fmt) override;
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout, DType fmt) override;
  void bias_backward(const Tensor& dbias, const Tensor& dout, DType fmt) override;
  void gelu_backward_dbias(const Tensor& dinp, const Tensor& dbias, const Tensor& inp,
                           const Tensor& dout, DType fmt) override;
  void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b, DType fmt) override;
  void residual_layernorm_forward(const Tensor& res, const Tensor& out, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& a, const Tensor& b,
                                  const Tensor& weight, const Tensor& bias, DType fmt) override;
  void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits,
                                     const Tensor& logits, const Tensor& targets, int V,
                                     float dloss, DType fmt) override;
  double sum_squares(const Tensor& t) override;
  bool all_finite(const Tensor& t) override;
  void adamw_update(const Tensor& master, const Tensor& param, const Tensor& grad, const Tensor& m,
                    const Tensor& v, const AdamWArgs& a, DType fmt) override;
  std::unique_ptr<Attention> make_attention(const AttentionConfig& cfg) override;

  // Stochastic rounding of the compute copy in adamw_update (BF16/FP16 only; off by default,
  // which is round-to-nearest-even like the CPU backend). The random bits of element i of a
  // parameter view are sr::random24(seed, AdamWArgs::step, param.offset() + i)
  // (cuda/stochastic_round.h): stateless, so with the run's seed a resumed run rounds
  // exactly as an uninterrupted one. Not reachable from the trainer's config yet.
  void set_stochastic_rounding(bool enabled, uint64_t seed = 0) {
    stochastic_rounding_ = enabled;
    sr_seed_ = seed;
  }

  // For benchmarks and tests that time or order work against the backend's stream.
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_index_; }
  ArenaStats memory_stats() const { return arena_->stats(); }
  MemoryStats memory() const override;
  void reset_peak_memory() override;
  // The backend's cuBLASLt GEMMs (attention's batched products use them too).
  LtGemm& gemm() { return *gemm_; }
  // cuDNN's handle and plan cache (cuda/attention_cudnn.cu), shared by every cudnn attention
  // layer of this backend; made on first use.
  struct CudnnState;
  std::shared_ptr<CudnnState>& cudnn_state() { return cudnn_state_; }

 private:
  void copy_convert(const Tensor& dst, const Tensor& src);
  void layernorm_backward_impl(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                               const Tensor& dnext, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                               DType fmt);
  // Device scratch of `bytes` from the arena, released when the returned Storage goes (its
  // reuse is ordered on the stream after the work queued with it).
  std::shared_ptr<Storage> scratch(size_t bytes);
  // Copies n host int32 values to fresh device memory (through the pinned staging buffer).
  std::shared_ptr<Storage> upload_ints(const int32_t* host, size_t n);
  // Copies `bytes` from device memory to the pinned result buffer and waits for it.
  const void* fetch_small(const void* dev, size_t bytes);

  int device_index_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<DeviceArena> arena_;
  std::unique_ptr<LtGemm> gemm_;
  // Pinned host memory: staging for uploads (reused once the last copy from it is done,
  // staged_ records that) and a small buffer for scalar results.
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  cudaEvent_t staged_ = nullptr;
  void* pinned_result_ = nullptr;
  bool stochastic_rounding_ = false;
  uint64_t sr_seed_ = 0;
  std::shared_ptr<CudnnState> cudnn_state_;
};

}  // namespace st
