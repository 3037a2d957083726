// Test and benchmark hooks of the CUDA flash attention (cuda/flash_attention.cu). The class
// itself is reached through CudaBackend::make_attention (cuda/attention_cuda.h); these
// functions look inside an Attention made that way and throw for any other Attention.
#pragma once
#include <string>
#include <vector>

#include "core/attention.h"

namespace st {

// delta (B, NH, T) of the last backward, exactly as the kernels formed and used it (FP32
// storage; values in format accum), copied to the host. Empty before the first backward.
std::vector<float> flash_cuda_last_delta(const Attention& attn);

// What the last forward kept for the backward's delta, copied to the host, (B, T, C):
// delta mode o_fp32: O before its final rounding (FP32); o_split: the residual
// round(O32 - round(O32)) widened to float. Empty in the other modes.
std::vector<float> flash_cuda_saved_o(const Attention& attn);

// The tile sizes the forward kernels support, for messages: "(64, 64), (128, 64) or ...".
std::string flash_cuda_supported_tiles();

}  // namespace st
