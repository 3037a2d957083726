// Flash attention forward, bf16 storage (kernel and dispatch in flash_fwd.cuh).
#include "cuda/flash_fwd.cuh"

namespace st::flash {
void fwd_bf16(const FwdParams& p, int bq, int bk, bool stab, bool acc_low, cudaStream_t s) {
  fwd_dispatch<__nv_bfloat16, false>(p, bq, bk, stab, acc_low, s);
}
}  // namespace st::flash
