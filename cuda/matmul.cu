// GEMMs on cuBLASLt, all row-major with weights stored (out, in):
//   forward   out (N,OC)  = inp (N,C) . weight (OC,C)^T + bias (OC)     (bias epilogue)
//   backward  dinp (N,C)  = dout (N,OC) . weight (OC,C)                  (beta = 0)
//             dweight (OC,C) += dout^T (OC,N) . inp (N,C)     (see Rounding: beta 0 or 1)
//
// Layout: cuBLASLt is column-major. A row-major (R,K) buffer is a column-major (K,R) matrix
// with ld = K, so each row-major product is computed transposed:
//   forward:  out^T (OC,N) = weight (OC,C) . inp^T (C,N)
//             A = weight, stored (C,OC) ld C, TRANSA = T;  B = inp, stored (C,N) ld C, N;
//             D = out, stored (OC,N) ld OC. The BIAS epilogue adds a vector along D's rows.
//   dinp:     dinp^T (C,N) = weight^T (C,OC) . dout^T (OC,N)
//             A = weight, stored (C,OC) ld C, N;  B = dout, stored (OC,N) ld OC, N;
//             D = dinp, stored (C,N) ld C.
//   dweight:  dweight^T (C,OC) = inp^T (C,N) . dout (N,OC)
//             A = inp, stored (C,N) ld C, N;  B = dout, stored (OC,N) ld OC, TRANSB = T;
//             D = C = dweight, stored (C,OC) ld C, beta = 1 (FP32); BF16/FP16: D = a
//             scratch product (beta = 0), then dweight = round(dweight + product).
//
// Rounding: compute and scale type FP32 (no TF32). BF16/FP16 results with beta = 0 are
// rounded once when D is stored, after the bias is added in FP32 (forward).
// Split-K algorithms that keep partial sums in the output type (in-place or output-type
// reductions) would round more than once, so the heuristic may only choose no split-K or
// FP32 (compute type) partial sums in the workspace.
// beta = 1 into a BF16/FP16 D is NOT a fixed rounding model: it depends on the algorithm the
// heuristic picks. Measured on an H200 (cuBLAS 13): algo 66 (the aligned shapes, ld a
// multiple of 8) rounds alpha * acc to D's type before adding beta * C, 99.9-100% of the
// elements equal round(C + round(acc)) (2026-11-27 call 2, Gpu.MatmulBackwardDweight-
// RoundingModel); at the parity test's odd shape (C = 100, OC = 300, N = 111, views 8
// elements in) the heuristic picks algo 23, which rounds once, round(C + acc): 99.92-99.99%
// of the elements (2026-11-28, the same test's printed counts), after 0-38 of 30,000
// differed from a CPU that rounded once (2026-11-27 call 1) and 25% from one that rounds
// twice (f8b7fb4's run). So backward_dweight never asks cuBLASLt to accumulate into a 16-bit D:
// the product is a beta = 0 GEMM into a scratch buffer (one rounding at its store, as every
// beta = 0 product here), then one elementwise add rounds dW + product once (the residual
// kernel): dW = round(dW + round(dout^T.inp)) for every shape and algorithm, as the CPU.
// FP32 dweight keeps the one beta = 1 GEMM (nothing to round but FP32 itself).
// Determinism: one algorithm is chosen per plan (shape, transposes, dtype, beta, pointer
// alignments) and cached, and cuBLASLt's algorithms give bit-identical results run to run
// on one GPU for a fixed algorithm and workspace (checked by the gpu tests).
// Strided-batched products (GemmOp::batch > 1, the attention's per-head GEMMs) set
// CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT and _STRIDED_BATCH_OFFSET on A, B and D; every product
// of the batch is computed and rounded exactly as a single GEMM of that shape would be.
// alpha (GemmOp::alpha, default 1) scales the FP32 accumulator before the store's one
// rounding: D = round(fl32(alpha * acc)) [+ bias / + beta * C in FP32 before the rounding].
// No GELU epilogue: cuBLASLt's GELU is its own approximation, not the CPU's tanhf formula,
// and the Backend interface keeps matmul and GELU separate calls.
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace st {

struct LtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d) ST_CUDA_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(d));
    if (b) ST_CUDA_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(b));
    if (a) ST_CUDA_CHECK_NOTHROW(cublasLtMatrixLayoutDestroy(a));
    if (desc) ST_CUDA_CHECK_NOTHROW(cublasLtMatmulDescDestroy(desc));
  }
};

namespace {

// Hopper's recommended cuBLASLt workspace; allocated once per backend.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    case DType::F32:
      return CUDA_R_32F;
    default:
      break;
  }
  fail("CUDA matmul: unsupported storage dtype ", dtype_name(t), " (expected bf16, fp16 or fp32)");
}

// Largest power of two <= 256 dividing the address; cuBLASLt algorithms need to know it.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

// The alignment every product of a strided batch has: that of the first pointer and of the
// stride in bytes (a single GEMM: the pointer's).
int batch_alignment(const void* p, int64_t batch, int64_t stride_elems, DType dtype) {
  const int al = alignment(p);
  if (batch <= 1) return al;
  const uintptr_t stride_bytes = static_cast<uintptr_t>(stride_elems) * dtype_size(dtype);
  return std::min(al, alignment(reinterpret_cast<const void*>(stride_bytes)));
}

// A strided batch on one matrix layout (batch 1: nothing set, as a single GEMM).
void set_batch(cublasLtMatrixLayout_t layout, int64_t batch, int64_t stride_elems) {
  if (batch <= 1) return;
  const int32_t count = static_cast<int32_t>(batch);
  ST_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                 &count, sizeof(count)));
  ST_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride_elems, sizeof(stride_elems)));
}

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& v) {
  ST_CUDA_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v)));
}
template <class T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& v) {
  ST_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)));
}

}  // namespace

LtGemm::LtGemm() {
  ST_CUDA_CHECK(cublasLtCreate(&handle_));
  workspace_bytes_ = kWorkspaceBytes;
  try {
    ST_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  } catch (...) {  // the destructor does not run for a throwing constructor
    ST_CUDA_CHECK_NOTHROW(cublasLtDestroy(handle_));
    throw;
  }
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (workspace_) ST_CUDA_CHECK_NOTHROW(cudaFree(workspace_));
  if (handle_) ST_CUDA_CHECK_NOTHROW(cublasLtDestroy(handle_));
}

LtGemm::Plan& LtGemm::plan(const Key& key, const void* bias) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  const auto [transa, transb, m, n, k, lda, ldb, ldd, dtype_int, has_bias, accumulate, align_a,
              align_b, align_d, align_bias, batch, stride_a, stride_b, stride_d] = key;
  const DType dtype = static_cast<DType>(dtype_int);
  const cudaDataType_t type = cuda_type(dtype);
  auto p = std::make_unique<Plan>();

  ST_CUDA_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, transa ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, transb ? CUBLAS_OP_T : CUBLAS_OP_N);
  const cublasLtEpilogue_t epi = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  // The bias has D's type (the default); the heuristic reads its pointer for alignment.
  if (has_bias) set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);

  // op(A) is (m,k), op(B) is (k,n), D is (m,n); the stored matrices are their transposes
  // when the op is T.
  ST_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, transa ? k : m, transa ? m : k, lda));
  ST_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, transb ? n : k, transb ? k : n, ldb));
  ST_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->d, type, m, n, ldd));
  set_batch(p->a, batch, stride_a);
  set_batch(p->b, batch, stride_b);
  set_batch(p->d, batch, stride_d);

  cublasLtMatmulPreference_t pref = nullptr;
  ST_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  try {
    set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{workspace_bytes_});
    const uint32_t schemes =
        CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(align_a));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(align_b));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(align_d));
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(align_d));
    ST_CUDA_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d, p->d, pref, 1,
                                                 &result, &found));
  } catch (...) {
    ST_CUDA_CHECK_NOTHROW(cublasLtMatmulPreferenceDestroy(pref));
    throw;
  }
  ST_CUDA_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    fail("CUDA matmul: cuBLASLt has no algorithm for ", dtype_name(dtype), " m=", m, " n=", n,
         " k=", k, " op(A)=", transa ? "T" : "N", " op(B)=", transb ? "T" : "N", " lda=", lda,
         " ldb=", ldb, " ldd=", ldd, has_bias ? " with bias" : "",
         accumulate ? " accumulating (beta = 1)" : "", " (alignments A/B/D/bias ", align_a, "/",
         align_b, "/", align_d, "/", align_bias, " bytes)", " batch ", batch, " strides A/B/D ",
         stride_a, "/", stride_b, "/", stride_d);
  }
  p->algo = result.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

LtGemm::Key LtGemm::key_of(const GemmOp& g) const {
  ST_CHECK(g.beta == 0.0f || g.beta == 1.0f, "GEMM beta must be 0 or 1, got ", g.beta);
  ST_CHECK(g.batch >= 1 && g.batch <= INT32_MAX, "GEMM batch count ", g.batch);
  ST_CHECK(g.batch == 1 || (g.stride_a >= 0 && g.stride_b >= 0 && g.stride_d > 0),
           "GEMM batch strides A/B/D ", g.stride_a, "/", g.stride_b, "/", g.stride_d);
  ST_CHECK(g.batch == 1 || g.bias == nullptr, "GEMM: no bias with a strided batch");
  const bool accumulate = g.beta != 0.0f;
  const bool batched = g.batch > 1;
  return Key{g.transa,
                g.transb,
                g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                g.ldd,
                static_cast<int>(g.dtype),
                g.bias != nullptr,
                accumulate,
                batch_alignment(g.A, g.batch, g.stride_a, g.dtype),
                batch_alignment(g.B, g.batch, g.stride_b, g.dtype),
                batch_alignment(g.D, g.batch, g.stride_d, g.dtype),
                g.bias ? alignment(g.bias) : 0,
                g.batch,
                batched ? g.stride_a : 0,
                batched ? g.stride_b : 0,
                batched ? g.stride_d : 0};
}

std::string LtGemm::describe(const GemmOp& g) {
  const Plan& p = plan(key_of(g), g.bias);
  const auto attr = [&](cublasLtMatmulAlgoConfigAttributes_t a) {
    uint32_t v = 0;  // ID, TILE_ID, STAGES_ID, SPLITK_NUM, REDUCTION_SCHEME: 32-bit or less
    size_t written = 0;
    ST_CUDA_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&p.algo, a, &v, sizeof(v), &written));
    return static_cast<long long>(v);
  };
  std::string s = "algo " + std::to_string(attr(CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
                  std::to_string(attr(CUBLASLT_ALGO_CONFIG_TILE_ID)) + " stages " +
                  std::to_string(attr(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " splitK " +
                  std::to_string(attr(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " reduction " +
                  std::to_string(attr(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
  return s;
}

void LtGemm::matmul(const GemmOp& g, cudaStream_t stream) {
  ST_CHECK(g.m > 0 && g.n >= 0 && g.k > 0, "GEMM sizes m=", g.m, " n=", g.n, " k=", g.k);
  if (g.n == 0) return;
  ST_CHECK(g.A && g.B && g.D, "null device pointer in GEMM");
  Plan& p = plan(key_of(g), g.bias);
  if (g.bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  const float alpha = g.alpha;
  // beta = 0: C is not read; beta = 1: C = D, accumulated in place in FP32, rounded once.
  ST_CUDA_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, g.A, p.a, g.B, p.b, &g.beta, g.D, p.d, g.D,
                               p.d, &p.algo, workspace_, workspace_bytes_, stream));
}

void LtGemm::run(void* out, const void* inp, const void* weight, const void* bias, int64_t N,
                 int64_t C, int64_t OC, DType dtype, cudaStream_t stream) {
  ST_CHECK(N >= 0 && C > 0 && OC > 0, "GEMM sizes N=", N, " C=", C, " OC=", OC);
  GemmOp g;
  g.transa = true;
  g.transb = false;
  g.m = OC;
  g.n = N;
  g.k = C;
  g.A = weight;
  g.lda = C;
  g.B = inp;
  g.ldb = C;
  g.D = out;
  g.ldd = OC;
  g.bias = bias;
  g.dtype = dtype;
  matmul(g, stream);
}

void LtGemm::backward_dinp(void* dinp, const void* dout, const void* weight, int64_t N, int64_t C,
                           int64_t OC, DType dtype, cudaStream_t stream) {
  GemmOp g;
  g.transa = false;
  g.transb = false;
  g.m = C;
  g.n = N;
  g.k = OC;
  g.A = weight;
  g.lda = C;
  g.B = dout;
  g.ldb = OC;
  g.D = dinp;
  g.ldd = C;
  g.dtype = dtype;
  matmul(g, stream);
}

GemmOp LtGemm::dweight_op(void* D, const void* dout, const void* inp, int64_t N, int64_t C,
                          int64_t OC, DType dtype, float beta) {
  GemmOp g;
  g.transa = false;
  g.transb = true;
  g.m = C;
  g.n = OC;
  g.k = N;
  g.A = inp;
  g.lda = C;
  g.B = dout;
  g.ldb = OC;
  g.D = D;
  g.ldd = C;
  g.beta = beta;
  g.dtype = dtype;
  return g;
}

void LtGemm::backward_dweight(void* dweight, void* product, const void* dout, const void* inp,
                              int64_t N, int64_t C, int64_t OC, DType dtype, cudaStream_t stream) {
  if (N == 0) return;  // dweight += 0
  if (dtype == DType::F32) {
    matmul(dweight_op(dweight, dout, inp, N, C, OC, dtype, 1.0f), stream);
    return;
  }
  ST_CHECK(product != nullptr && product != dweight,
           "CUDA matmul backward: a BF16/FP16 dweight needs its own product buffer");
  matmul(dweight_op(product, dout, inp, N, C, OC, dtype, 0.0f), stream);
  cudak::residual_forward(dweight, dweight, product, static_cast<size_t>(OC * C), dtype, stream);
}

}  // namespace st
