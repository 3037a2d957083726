// Creating a backend. The implementations sit above the kernels they call: the CPU backend
// (backends/cpu_backend.cpp) assembles layers/, attention/ and optim/'s CPU kernels; the
// CUDA backend lives in cuda/ (its own library, linked in when built with CUDA; otherwise
// backends/cuda_stub.cpp answers). Everything else sees only core/backend.h's interface.
#pragma once
#include <memory>
#include <string>

#include "core/backend.h"

namespace st {

// threads <= 0: leave the thread count to OpenMP/BLAS defaults.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// Throws a clear error in a build without CUDA or on a machine without a GPU.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0);
bool cuda_available();  // built with CUDA and a device is present
// device: auto | cpu | cuda; threads applies to the CPU backend (0: OpenMP default).
std::unique_ptr<Backend> make_backend(const std::string& device, int threads = 0);

}  // namespace st
