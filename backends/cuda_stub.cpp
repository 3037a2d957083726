// Built when the CUDA backend is not compiled in: asking for it is a clear error.
#include "backends/backends.h"

namespace st {

bool cuda_available() { return false; }

std::unique_ptr<Backend> make_cuda_backend(int) {
  fail("device 'cuda' requested, but this build has no CUDA backend "
       "(reconfigure with -DSTABLETRAIN_CUDA=ON on a machine with nvcc)");
}

}  // namespace st
