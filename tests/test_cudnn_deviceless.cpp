// cuDNN's fused attention without a GPU (label cpu; built only with cuDNN 9): the forward and
// backward graphs cuda/attention_cudnn.cu hands cuDNN, planned devicelessly for an H100
// (cuDNN >= 9.8 plans for a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR; tests/data/
// cudnn_deviceprop_h100_sxm.json: the cudaGetDeviceProperties values of an H100 SXM5, from
// which cuDNN's heuristics read the SM version 9.0, the 132 SMs and the shared memory).
//
// What it shows: cuDNN's heuristics recognise both graphs and propose engines that pass
// cuDNN's own support checks, every proposed engine's kernel is generated and compiled, and
// the backward engines are deterministic by cuDNN's numerical notes. Without a driver (this
// machine: the toolkit's stub libcuda, CMake points LD_LIBRARY_PATH at it) finalizing stops
// where the compiled kernel would be loaded into the GPU, so that is the one failure allowed.
// What it cannot show: that the kernels run, or their numbers (tests/test_gpu_flash.cpp,
// GpuCudnn.*, on a GPU). Nor that the graph computes attention: cuDNN accepts well-formed
// graphs that compute something else too (tried: the backward without its P^T reshape, so
// dV = P dO, passes here). It fails where cuDNN has no engine (the FP32 test below).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cuda/attention_cuda.h"

namespace st {
namespace {

std::string h100() {
  std::ifstream f(std::string(ST_TEST_DATA_DIR) + "/cudnn_deviceprop_h100_sxm.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Finalized, or stopped only at loading the compiled kernel (no GPU here).
bool compiled(const CudnnDevicelessConfig& c) {
  return c.finalized || c.status.find("cuLibraryLoadData") != std::string::npos;
}

TEST(CudnnDeviceless, BothGraphsPassCudnnsChecksForAnH100) {
  const std::string dev = h100();
  ASSERT_FALSE(dev.empty());
  struct Case {
    int B, T, NH, HS;
    DType fmt;
    bool causal;
  };
  // The GPU tests' shapes (T not a multiple of 64) and GPT-2 small's (B 16, T 1024).
  for (const Case& c : {Case{2, 200, 4, 64, DType::BF16, true}, Case{1, 257, 2, 128, DType::F16, true},
                        Case{16, 1024, 12, 64, DType::BF16, true}, Case{1, 130, 2, 128, DType::BF16, false}}) {
    const CudnnDevicelessReport r = cudnn_plan_deviceless(dev, c.B, c.T, c.NH, c.HS, c.fmt, c.causal);
    char name[128];
    std::snprintf(name, sizeof name, "B=%d T=%d NH=%d HS=%d %s %s", c.B, c.T, c.NH, c.HS,
                  dtype_name(c.fmt), c.causal ? "causal" : "noncausal");
    SCOPED_TRACE(name);
    for (const auto* list : {&r.forward, &r.backward}) {
      const char* pass = list == &r.forward ? "forward" : "backward";
      EXPECT_FALSE(list->empty()) << pass << ": cuDNN " << r.version << " proposes no engine";
      for (const CudnnDevicelessConfig& e : *list) {
        std::printf("cudnn deviceless %s %s: engine %lld, %s, %s\n", name, pass,
                    static_cast<long long>(e.engine),
                    e.nondeterministic ? "NON-deterministic" : "deterministic", e.status.c_str());
        EXPECT_TRUE(compiled(e)) << pass << " engine " << e.engine << ": " << e.status;
        if (list == &r.backward) {
          EXPECT_FALSE(e.nondeterministic) << "backward engine " << e.engine;
        }
      }
    }
  }
}

// The check can fail: cuDNN has no backward engine for FP32 inputs (its fused attention takes
// 16-bit ones), and the same planning then proposes none.
TEST(CudnnDeviceless, NoBackwardEngineForFp32Inputs) {
  const CudnnDevicelessReport r = cudnn_plan_deviceless(h100(), 2, 200, 4, 64, DType::F32, true);
  EXPECT_TRUE(r.backward.empty()) << r.backward.size() << " backward engines for FP32";
}

}  // namespace
}  // namespace st
