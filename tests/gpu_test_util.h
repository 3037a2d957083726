// What every gpu-labelled test (test_gpu_kernels, test_gpu_attention, test_gpu_flash,
// test_gpu_model) does first: require_gpu() FAILS the test, never skips it, on a machine
// without a CUDA GPU, with the one message that says what to run instead; GpuAndCpu is the
// fixture of the tests that compare the two backends.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "backends/backends.h"
#include "core/backend.h"

namespace st {

// A fatal failure when no CUDA GPU is present. It returns from require_gpu() only: a fixture's
// SetUp checks HasFatalFailure() and returns (gtest then skips the test body).
inline void require_gpu() {
  if (!cuda_available())
    GTEST_FAIL() << "no CUDA GPU is present on this machine: the gpu-labelled tests need one "
                    "(run tools/gpu_check.sh on a GPU machine)";
}

// A fixture holding the GPU backend and the CPU backend, after require_gpu().
class GpuAndCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    require_gpu();
    if (HasFatalFailure()) return;
    gpu_ = make_cuda_backend(0);
    cpu_ = make_cpu_backend();
  }
  std::unique_ptr<Backend> gpu_, cpu_;
};

}  // namespace st
