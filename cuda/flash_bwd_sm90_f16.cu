// The sm_90a flash attention dK/dV and dQ kernels and the dp_p delta pass, f16 storage (flash_bwd_sm90.cuh).
#include "cuda/flash_bwd_sm90.cuh"

namespace st::flash {

void dkdv_sm90_f16(const BwdParams& p, bool acc_low, cudaStream_t s) {
  sm90::dkdv_dispatch<__half>(p, acc_low, s);
}
void dq_sm90_f16(const BwdParams& p, bool acc_low, bool delta_pass, cudaStream_t s) {
  sm90::dq_dispatch<__half>(p, acc_low, delta_pass, s);
}

}  // namespace st::flash
