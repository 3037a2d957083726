// SIMT emulator stand-in for <cublasLt.h>: only what cuda/cuda_check.h names. cuBLASLt is
// NVIDIA's library, not our code: it is not emulated (its GEMMs are checked on a GPU).
#pragma once
#include "simt/simt.h"
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
inline const char* cublasLtGetStatusName(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}
inline const char* cublasLtGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : "cuBLASLt is not emulated (needs a GPU)";
}
