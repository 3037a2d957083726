// The flash and stabilized-flash CUDA kernels are not written yet (issue 9): make_attention
// refuses them loudly on the GPU rather than falling back to anything else.
#include "core/error.h"
#include "cuda/attention_cuda.h"

namespace st {
std::unique_ptr<Attention> make_attention_cuda_flash(CudaBackend&, const AttentionConfig& cfg) {
  fail("CUDA backend: attention.backend ", attention_kind_name(cfg.kind),
       " is not implemented on the GPU yet (issue 9); use baseline, or device: cpu");
}
}  // namespace st
