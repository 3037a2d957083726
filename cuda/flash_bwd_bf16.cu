// Flash attention backward and the dp_p delta pass, bf16 storage (flash_bwd.cuh).
#include "cuda/flash_bwd.cuh"

namespace st::flash {
void bwd_bf16(const BwdParams& p, bool acc_low, cudaStream_t s) {
  bwd_dispatch<__nv_bfloat16>(p, acc_low, s);
}
void delta_dpp_bf16(const BwdParams& p, bool acc_low, cudaStream_t s) {
  delta_dpp_dispatch<__nv_bfloat16>(p, acc_low, s);
}
}  // namespace st::flash
