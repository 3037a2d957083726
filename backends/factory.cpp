#include "backends/backends.h"

namespace st {

std::unique_ptr<Backend> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  if (device == "cuda") return make_cuda_backend();
  if (device == "auto") return cuda_available() ? make_cuda_backend() : make_cpu_backend(threads);
  fail("unknown device '", device, "' (expected auto, cpu or cuda)");
}

}  // namespace st
