// Helpers shared by the SIMT emulator's kernel tests (test_simt_kernels.cpp,
// test_simt_flash.cpp): device buffers as host memory, and the two-schedule run that every
// kernel test goes through.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "simt/simt.h"

namespace st::simt_test {

// A device buffer of n elements of storage dtype `s` (host memory under the emulator),
// 128-byte aligned (kernels read with 16-byte cp.async / vector loads, whose alignment the
// emulator checks), filled with `fill` bytes: the poison that shows an element no kernel
// wrote (0xFF is NaN in bf16, fp16 and fp32, and -1 in int32). Copies share the bytes: each
// schedule of two_schedules allocates fresh buffers, so earlier results stay untouched.
struct Buf {
  DType dtype = DType::F32;
  size_t count = 0;
  std::shared_ptr<unsigned char> mem;
  Buf() = default;
  Buf(DType s, size_t n, unsigned char fill = 0xFF) : dtype(s), count(n) {
    const size_t bytes = std::max<size_t>(n * dtype_size(s), 1);
    mem.reset(static_cast<unsigned char*>(::operator new (bytes, std::align_val_t{128})),
              [](unsigned char* p) { ::operator delete (p, std::align_val_t{128}); });
    std::memset(mem.get(), fill, bytes);
  }
  size_t n() const { return count; }
  size_t nbytes() const { return count * dtype_size(dtype); }
  void* p() const { return count ? mem.get() : nullptr; }
  float* f() const { return static_cast<float*>(p()); }
  // Element i as a float (bf16 / fp16 widened exactly).
  float get(size_t i) const {
    uint16_t h;
    switch (dtype) {
      case DType::BF16:
        std::memcpy(&h, mem.get() + 2 * i, 2);
        return bf16_bits_to_float(h);
      case DType::F16:
        std::memcpy(&h, mem.get() + 2 * i, 2);
        return fp16_bits_to_float(h);
      default: {
        float v;
        std::memcpy(&v, mem.get() + 4 * i, 4);
        return v;
      }
    }
  }
  // Stores v rounded to the buffer's dtype (F32 / BF16 / F16 only).
  void set(size_t i, float v) {
    uint16_t h;
    switch (dtype) {
      case DType::BF16:
        h = float_to_bf16_bits(v);
        std::memcpy(mem.get() + 2 * i, &h, 2);
        break;
      case DType::F16:
        h = float_to_fp16_bits(v);
        std::memcpy(mem.get() + 2 * i, &h, 2);
        break;
      default:
        std::memcpy(mem.get() + 4 * i, &v, 4);
    }
  }
};

inline bool same_bytes(const Buf& a, const Buf& b) {
  if (a.dtype != b.dtype || a.count != b.count) return false;
  return a.count == 0 || std::memcmp(a.mem.get(), b.mem.get(), a.nbytes()) == 0;
}

// Host values already representable in the storage dtype `s`, as a device buffer.
inline Buf dev(const std::vector<float>& v, DType s) {
  Buf b(s, v.size());
  for (size_t i = 0; i < v.size(); ++i) b.set(i, v[i]);
  return b;
}

// The same values as a CPU-backend FP32 tensor.
inline Tensor host(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

// Runs `launch_all` (which fills and launches on fresh buffers and returns the outputs)
// under two schedules (seeds 1 and 2: other thread interleavings and block orders). The
// outputs must be bit-identical, every launch must pass the emulator's checks
// (simt::failures() unchanged), and no CUDA error may be left pending. Returns the first
// schedule's outputs.
inline std::vector<Buf> two_schedules(const std::function<std::vector<Buf>()>& launch_all) {
  std::vector<Buf> first;
  for (uint64_t seed : {1, 2}) {
    simt::options().schedule_seed = seed;
    const uint64_t fails = simt::failures();
    std::vector<Buf> out;
    try {
      out = launch_all();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": " << e.what();
    }
    simt::options().schedule_seed = 0;
    EXPECT_EQ(simt::failures(), fails) << "seed " << seed << ": " << simt::last_failure();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "seed " << seed << ": " << simt::last_failure();
    if (seed == 1) {
      first = out;
    } else {
      EXPECT_EQ(out.size(), first.size());
      for (size_t i = 0; i < std::min(out.size(), first.size()); ++i)
        EXPECT_TRUE(same_bytes(out[i], first[i])) << "output " << i << " differs between schedules";
    }
  }
  return first;
}

}  // namespace st::simt_test
