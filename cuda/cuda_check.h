// One checking macro family for every CUDA-side library call. A failed call throws
// st::Error naming the call's own text, the library's error name and string, and file:line:
//   "cudaMalloc(&p, bytes) failed: out of memory [cudaErrorMemoryAllocation] at cuda/x.cu:42"
//
// Adding a library (cuDNN, NCCL, ...) is one overload set of is_ok / status_name /
// status_string for its status type; the macros stay the same. cuDNN and NCCL are opted
// in by their build flags (ST_WITH_CUDNN, ST_WITH_NCCL) so this header never needs them.
#pragma once
#include <cublasLt.h>  // also declares cublasStatus_t (cublas_api.h)
#include <cuda_runtime_api.h>

#include <cstdio>

#include "core/error.h"

#if defined(ST_WITH_CUDNN)
#include <cudnn.h>
#endif
#if defined(ST_WITH_NCCL)
#include <nccl.h>
#endif

namespace st::cuda_detail {

// CUDA runtime.
inline bool is_ok(cudaError_t e) {
  return e == cudaSuccess;
}
inline const char* status_name(cudaError_t e) {
  return cudaGetErrorName(e);
}
inline const char* status_string(cudaError_t e) {
  return cudaGetErrorString(e);
}

// cuBLAS and cuBLASLt share cublasStatus_t.
inline bool is_ok(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS;
}
inline const char* status_name(cublasStatus_t s) {
  return cublasLtGetStatusName(s);
}
inline const char* status_string(cublasStatus_t s) {
  return cublasLtGetStatusString(s);
}

#if defined(ST_WITH_CUDNN)
inline bool is_ok(cudnnStatus_t s) {
  return s == CUDNN_STATUS_SUCCESS;
}
inline const char* status_name(cudnnStatus_t s) {
  return cudnnGetErrorString(s);
}
inline const char* status_string(cudnnStatus_t s) {
  return cudnnGetErrorString(s);
}
#endif

#if defined(ST_WITH_NCCL)
inline bool is_ok(ncclResult_t r) {
  return r == ncclSuccess;
}
inline const char* status_name(ncclResult_t r) {
  return ncclGetErrorString(r);
}
inline const char* status_string(ncclResult_t r) {
  return ncclGetErrorString(r);
}
#endif

template <class Status>
inline void check(Status s, const char* call, const char* file, int line) {
  if (!is_ok(s)) {
    ::st::fail(call, " failed: ", status_string(s), " [", status_name(s), "] at ", file, ":", line);
  }
}

// For destructors and deleters, which must not throw: report on stderr and go on.
template <class Status>
inline void check_nothrow(Status s, const char* call, const char* file, int line) noexcept {
  if (!is_ok(s)) {
    std::fprintf(stderr, "warning: %s failed: %s [%s] at %s:%d\n", call, status_string(s),
                 status_name(s), file, line);
  }
}

}  // namespace st::cuda_detail

// ST_CUDA_CHECK(cudaMemcpy(...)), ST_CUDA_CHECK(cublasLtMatmul(...)), ...
#define ST_CUDA_CHECK(call) ::st::cuda_detail::check((call), #call, __FILE__, __LINE__)
#define ST_CUDA_CHECK_NOTHROW(call) \
  ::st::cuda_detail::check_nothrow((call), #call, __FILE__, __LINE__)
// After a kernel launch <<<...>>>: catches bad launch configurations at the launch site.
// `what` names the kernel, e.g. ST_CUDA_CHECK_LAUNCH("convert_kernel<f32->bf16>").
#define ST_CUDA_CHECK_LAUNCH(what) \
  ::st::cuda_detail::check(cudaGetLastError(), what, __FILE__, __LINE__)
