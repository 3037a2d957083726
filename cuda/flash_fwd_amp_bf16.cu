// Flash attention forward with the O~ amplifier (attention.o_tilde_bits / o_tilde_gain /
// o_tilde_scope), bf16 storage: the kernel of flash_fwd.cuh with AMP = true, in a file of its
// own so the plain kernels' build does not grow with it.
#include "cuda/flash_fwd.cuh"

namespace st::flash {
void fwd_amp_bf16(const FwdParams& p, int bq, int bk, bool stab, bool acc_low, cudaStream_t s) {
  fwd_dispatch<__nv_bfloat16, true>(p, bq, bk, stab, acc_low, s);
}
}  // namespace st::flash
