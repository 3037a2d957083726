// The forward GEMM on cuBLASLt: out (N,OC) = inp (N,C) . weight (OC,C)^T + bias (OC).
//
// Layout: cuBLASLt is column-major. A row-major (R,K) buffer is a column-major (K,R) matrix
// with ld = K, so the row-major product is computed transposed:
//   out^T (OC,N) = weight (OC,C) . inp^T (C,N)
//   A = weight, stored (C,OC) ld C, TRANSA = T;  B = inp, stored (C,N) ld C, TRANSB = N;
//   D = out, stored (OC,N) ld OC.  The BIAS epilogue adds a vector along D's rows (OC).
//
// Rounding: compute and scale type FP32 (no TF32). BF16/FP16 results are rounded once when
// D is stored, after the bias is added in FP32. Split-K algorithms that keep partial sums
// in the output type (in-place or output-type reductions) would round more than once, so
// the heuristic may only choose no split-K or FP32 (compute type) partial sums.
#include <cublasLt.h>

#include <cstring>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"

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

  const auto [m, n, k, dtype_int, has_bias, align_a, align_b, align_d, align_bias] = key;
  const DType dtype = static_cast<DType>(dtype_int);
  const cudaDataType_t type = cuda_type(dtype);
  auto p = std::make_unique<Plan>();

  ST_CUDA_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  const cublasLtEpilogue_t epi = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  // The bias has D's type (the default); the heuristic reads its pointer for alignment.
  if (has_bias) set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);

  ST_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, k, m, k));  // weight (C,OC) ld C
  ST_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, k, n, k));  // inp (C,N) ld C
  ST_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->d, type, m, n, m));  // out (OC,N) ld OC

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
    fail("CUDA matmul: cuBLASLt has no algorithm for ", dtype_name(dtype), " N=", n, " C=", k,
         " OC=", m, has_bias ? " with bias" : "", " (alignments A/B/D/bias ", align_a, "/", align_b,
         "/", align_d, "/", align_bias, " bytes)");
  }
  p->algo = result.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void LtGemm::run(void* out, const void* inp, const void* weight, const void* bias, int64_t N,
                 int64_t C, int64_t OC, DType dtype, cudaStream_t stream) {
  ST_CHECK(N >= 0 && C > 0 && OC > 0, "GEMM sizes N=", N, " C=", C, " OC=", OC);
  if (N == 0) return;
  ST_CHECK(out && inp && weight, "null device pointer in GEMM");
  const Key key{OC,
                N,
                C,
                static_cast<int>(dtype),
                bias != nullptr,
                alignment(weight),
                alignment(inp),
                alignment(out),
                bias ? alignment(bias) : 0};
  Plan& p = plan(key, bias);
  if (bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f, beta = 0.0f;  // beta = 0: C is not read
  ST_CUDA_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, weight, p.a, inp, p.b, &beta, out, p.d, out,
                               p.d, &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace st
