// The sm_90a flash attention forward kernel for fp16 storage (flash_fwd_sm90.cuh).
#include "cuda/flash_fwd_sm90.cuh"

namespace st::flash {

void fwd_sm90_f16(const FwdParams& p, bool stab, bool acc_low, cudaStream_t s) {
  sm90::dispatch<__half>(p, stab, acc_low, s);
}

}  // namespace st::flash
