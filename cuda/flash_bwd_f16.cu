// Flash attention backward and the dp_p delta pass, fp16 storage (flash_bwd.cuh).
#include "cuda/flash_bwd.cuh"

namespace st::flash {
void bwd_f16(const BwdParams& p, bool acc_low, cudaStream_t s) {
  bwd_dispatch<__half>(p, acc_low, s);
}
void delta_dpp_f16(const BwdParams& p, bool acc_low, cudaStream_t s) {
  delta_dpp_dispatch<__half>(p, acc_low, s);
}
}  // namespace st::flash
