// The flash kernels' GPU tests come with the kernels (issue 9).
#include <gtest/gtest.h>

#include "core/backend.h"
#include "core/error.h"

TEST(GpuFlash, RefusedLoudlyUntilWritten) {
  if (!st::cuda_available()) GTEST_FAIL() << "no CUDA GPU is present on this machine";
  auto be = st::make_cuda_backend(0);
  st::AttentionConfig c;
  c.kind = st::AttentionKind::Flash;
  EXPECT_THROW(be->make_attention(c), st::Error);
}
