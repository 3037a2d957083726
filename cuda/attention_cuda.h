// The CUDA attention backends behind the one Attention interface (core/attention.h),
// chosen per layer by CudaBackend::make_attention from AttentionConfig::kind:
//   baseline                 cuda/attention_baseline.cu: batched cuBLASLt GEMMs and
//                            softmax kernels, S and P materialised in the compute format
//   flash, stabilized_flash  cuda/flash_attention*.cu: our FlashAttention-2-class kernels
//                            (mma.sync), the stabilized variant a template parameter
// Each factory checks the configuration against what its kernels implement and throws a
// one-line error naming the attention.* setting otherwise: a GPU run never silently does
// something other than what its config says.
// Layouts as the CPU: qkv (B, T, 3C) packed, out (B, T, C), lse (B, NH, T) FP32; the
// kernels read and write the packed layout (or permute through arena scratch).
#pragma once
#include <memory>

#include "core/attention.h"

namespace st {

class CudaBackend;

std::unique_ptr<Attention> make_attention_cuda_baseline(CudaBackend& be,
                                                        const AttentionConfig& cfg);
std::unique_ptr<Attention> make_attention_cuda_flash(CudaBackend& be, const AttentionConfig& cfg);

}  // namespace st
