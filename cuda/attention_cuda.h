// The CUDA attention backends behind the one Attention interface (core/attention.h),
// chosen per layer by CudaBackend::make_attention from AttentionConfig::kind:
//   baseline                 cuda/attention_baseline.cu: batched cuBLASLt GEMMs and
//                            softmax kernels, S and P materialised in the compute format
//   flash, stabilized_flash  cuda/flash_attention*.cu: our FlashAttention-2-class kernels
//                            (mma.sync), the stabilized variant a template parameter
//   cudnn                    cuda/attention_cudnn.cu: NVIDIA's fused flash attention through
//                            cuDNN 9's graph API (a build without cuDNN refuses it)
// Each factory checks the configuration against what its kernels implement and throws a
// one-line error naming the attention.* setting otherwise: a GPU run never silently does
// something other than what its config says.
// Layouts as the CPU: qkv (B, T, 3C) packed, out (B, T, C), lse (B, NH, T) FP32; the
// kernels read and write the packed layout (or permute through arena scratch).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/attention.h"

namespace st {

class CudaBackend;

std::unique_ptr<Attention> make_attention_cuda_baseline(CudaBackend& be,
                                                        const AttentionConfig& cfg);
std::unique_ptr<Attention> make_attention_cuda_flash(CudaBackend& be, const AttentionConfig& cfg);
std::unique_ptr<Attention> make_attention_cuda_cudnn(CudaBackend& be, const AttentionConfig& cfg);

// "cuDNN 9.19.0 (built with 9.19.0)" when this build has the cudnn backend, else a sentence
// saying it has none (for probes, benchmarks and test output).
std::string cudnn_version_text();
// For tests and benchmarks, on an Attention made with backend cudnn (throws otherwise): the
// cuDNN version and, for the last forward and backward, the engine, its workspace and
// whether cuDNN's numerical notes call it deterministic.
std::string cudnn_attention_describe(const Attention& attn);
bool cudnn_attention_nondeterministic(const Attention& attn);  // of the last backward
// The forward and backward graphs planned without a GPU, for the device a cuDNN
// device-properties JSON describes (cuDNN >= 9.8, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR): the
// same graphs and heuristics a GPU run uses, then an attempt to finalize a plan of every
// engine configuration the heuristics propose (after cuDNN's own support checks). Without a
// driver, finalizing compiles the runtime-compiled kernels and stops where they would be
// loaded into the GPU (status names cuLibraryLoadData).
struct CudnnDevicelessConfig {
  int64_t engine = -1;
  bool nondeterministic = false;  // cuDNN's numerical notes
  bool finalized = false;
  std::string status;  // "finalized", or cuDNN's error
  int64_t workspace = 0;
};
struct CudnnDevicelessReport {
  std::string version;  // the cuDNN library's
  std::vector<CudnnDevicelessConfig> forward, backward;
};
CudnnDevicelessReport cudnn_plan_deviceless(const std::string& device_json, int B, int T,
                                            int NH, int HS, DType fmt, bool causal);

}  // namespace st
