// Exhaustive checks of the numeric-format conversions in core/dtype.h against CUDA's own
// host-side implementations (cuda_bf16.h / cuda_fp16.h compiled by the host compiler; no
// GPU and no CUDA runtime library are needed, the functions are inline):
//   * st::float_to_bf16_bits == __float2bfloat16_rn and st::float_to_fp16_bits ==
//     __float2half_rn, bit for bit, for all 2^32 float patterns (NaN, Inf, subnormals);
//   * st::bf16_bits_to_float == __bfloat162float and st::fp16_bits_to_float ==
//     __half2float for all 65536 patterns (NaN: both NaN), and the bulk convert_* agree;
//   * st::round_inplace(BF16/F16) (the vectorised array path, scalar tail included) ==
//     round_bf16 / round_fp16 bit for bit for every non-NaN pattern, and NaN for NaN;
//     its threaded path (arrays over 2^16) on a 2^24-element sample of all patterns.
// Each 16-bit format takes one OpenMP pass over the 2^32 patterns: each thread fills a
// cache-sized block with consecutive patterns, round_inplace-s it, and checks every
// pattern against CUDA and the rounded block against the scalar result. Mismatches are
// counted per check and the lowest few input patterns are reported.
// The reference is CUDA's host code path (device code uses cvt.rn.*; not checked here).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/dtype.h"

namespace {

constexpr int64_t kAllFloats = int64_t{1} << 32;
constexpr size_t kReport = 8;  // mismatches listed per check

inline uint16_t cuda_bf16_bits(float f) {
  const __nv_bfloat16 b = __float2bfloat16_rn(f);
  uint16_t u;
  std::memcpy(&u, &b, 2);
  return u;
}
inline uint16_t cuda_fp16_bits(float f) {
  const __half h = __float2half_rn(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float cuda_bf16_to_float(uint16_t u) {
  __nv_bfloat16_raw r;
  r.x = u;
  return __bfloat162float(__nv_bfloat16(r));
}
inline float cuda_fp16_to_float(uint16_t u) {
  __half_raw r;
  r.x = u;
  return __half2float(__half(r));
}

struct Mismatch {
  uint32_t input;
  uint32_t ours, ref;  // output bit patterns
};

// Mismatch count plus, per thread, the kReport lowest inputs seen.
class Mismatches {
 public:
  Mismatches() : per_thread_(static_cast<size_t>(omp_get_max_threads())) {}
  void add(uint32_t in, uint32_t ours, uint32_t ref) {
    auto& v = per_thread_[static_cast<size_t>(omp_get_thread_num())];
    const auto at = std::lower_bound(v.begin(), v.end(), in,
                                     [](const Mismatch& m, uint32_t x) { return m.input < x; });
    if (at != v.end() && at->input == in) return;  // already listed
    if (v.size() == kReport) {
      if (at == v.end()) return;
      v.pop_back();
    }
    v.insert(at, Mismatch{in, ours, ref});
  }
  std::string report(const char* what, int64_t count, int out_hex_digits) const {
    std::vector<Mismatch> all;
    for (const auto& v : per_thread_) all.insert(all.end(), v.begin(), v.end());
    std::sort(all.begin(), all.end(),
              [](const Mismatch& a, const Mismatch& b) { return a.input < b.input; });
    all.erase(std::unique(all.begin(), all.end(),
                          [](const Mismatch& a, const Mismatch& b) { return a.input == b.input; }),
              all.end());
    std::string s = std::string(what) + ": " + std::to_string(count) + " mismatches";
    char buf[160];
    for (size_t i = 0; i < all.size() && i < kReport; ++i) {
      std::snprintf(buf, sizeof buf, "\n  input 0x%08x (%.9g): ours 0x%0*x, reference 0x%0*x",
                    all[i].input, static_cast<double>(st::bits_float(all[i].input)),
                    out_hex_digits, all[i].ours, out_hex_digits, all[i].ref);
      s += buf;
    }
    return s;
  }

 private:
  std::vector<std::vector<Mismatch>> per_thread_;
};

// Same bits, or both NaN.
bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || st::float_bits(a) == st::float_bits(b);
}

TEST(DtypeExhaustive, Bf16ToFloatMatchesCudaForAllHalves) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> bulk(65536);
  st::convert_bf16_to_f32(all.data(), bulk.data(), all.size());
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = st::bf16_bits_to_float(static_cast<uint16_t>(h));
    const float ref = cuda_bf16_to_float(static_cast<uint16_t>(h));
    const bool ok = same_float(ours, ref) && same_float(bulk[h], ref);
    if (!ok && ++bad <= static_cast<int>(kReport))
      ADD_FAILURE() << "bf16 0x" << std::hex << h << ": ours 0x" << st::float_bits(ours)
                    << ", bulk 0x" << st::float_bits(bulk[h]) << ", __bfloat162float 0x"
                    << st::float_bits(ref);
  }
  EXPECT_EQ(bad, 0);
}

TEST(DtypeExhaustive, Fp16ToFloatMatchesCudaForAllHalves) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> bulk(65536);
  st::convert_fp16_to_f32(all.data(), bulk.data(), all.size());
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = st::fp16_bits_to_float(static_cast<uint16_t>(h));
    const float ref = cuda_fp16_to_float(static_cast<uint16_t>(h));
    const bool ok = same_float(ours, ref) && same_float(bulk[h], ref);
    if (!ok && ++bad <= static_cast<int>(kReport))
      ADD_FAILURE() << "fp16 0x" << std::hex << h << ": ours 0x" << st::float_bits(ours)
                    << ", bulk 0x" << st::float_bits(bulk[h]) << ", __half2float 0x"
                    << st::float_bits(ref);
  }
  EXPECT_EQ(bad, 0);
}

// Round-trips through the 16-bit formats are exact: every bf16/fp16 value, widened to
// float, converts back to the same bits (NaN to the canonical NaN).
TEST(DtypeExhaustive, HalfRoundTripsAreExact) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float fb = st::bf16_bits_to_float(b), fh = st::fp16_bits_to_float(b);
    const uint16_t want_b = std::isnan(fb) ? 0x7fff : b, want_h = std::isnan(fh) ? 0x7fff : b;
    if (st::float_to_bf16_bits(fb) != want_b || st::float_to_fp16_bits(fh) != want_h) {
      if (++bad <= static_cast<int>(kReport)) ADD_FAILURE() << "round trip of 0x" << std::hex << h;
    }
  }
  EXPECT_EQ(bad, 0);
}

// One pass over all 2^32 float patterns for one 16-bit format:
//   float_to_bits(f) == cuda_bits(f) (bit for bit, NaN and Inf included), and
//   round_inplace(t) == bits_to_float(float_to_bits(f)), i.e. the scalar round_bf16 /
//   round_fp16, bit for bit for non-NaN f, and NaN for NaN f.
// Threads take cache-sized blocks whose length is not a multiple of the vector width (so
// round_inplace's scalar tail runs too; its own threading is covered by the next test).
// A block is first checked by a branch-free count and rescanned only when it is nonzero.
template <class Ours, class Cuda, class Widen>
void check_all_floats(st::DType t, Ours float_to_bits, Cuda cuda_bits, Widen bits_to_float,
                      const char* conv_what, const char* round_what) {
  const int64_t block = 65533;  // < 2^16: round_inplace runs single-threaded here
  Mismatches conv_mm, round_mm;
  int64_t conv_bad = 0, round_bad = 0;
  // 0: all good; bit 0: conversion mismatch; bit 1: round_inplace mismatch.
  auto check = [&](uint32_t u, float got, uint16_t& ours, uint16_t& ref, float& want) {
    const float f = st::bits_float(u);
    ours = float_to_bits(f);
    ref = cuda_bits(f);
    want = bits_to_float(ours);
    const uint32_t g = st::float_bits(got);
    const bool in_nan = (u & 0x7fffffffu) > 0x7f800000u;
    const bool got_nan = (g & 0x7fffffffu) > 0x7f800000u;
    const bool round_ok = in_nan ? got_nan : g == st::float_bits(want);
    return static_cast<int>(ours != ref) | (static_cast<int>(!round_ok) << 1);
  };
#pragma omp parallel reduction(+ : conv_bad, round_bad)
  {
    std::vector<float> buf(static_cast<size_t>(block));
    float* x = buf.data();
#pragma omp for schedule(dynamic, 64)
    for (int64_t base = 0; base < kAllFloats; base += block) {
      const int64_t n = std::min(block, kAllFloats - base);
      for (int64_t j = 0; j < n; ++j) x[j] = st::bits_float(static_cast<uint32_t>(base + j));
      st::round_inplace(t, x, static_cast<size_t>(n));
      uint32_t flags = 0;  // branch-free, so that the inlinable formats vectorise
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t u = static_cast<uint32_t>(base + j);
        const float f = st::bits_float(u);
        const uint32_t ours = float_to_bits(f), ref = cuda_bits(f);
        const uint32_t want = st::float_bits(bits_to_float(static_cast<uint16_t>(ours)));
        const uint32_t g = st::float_bits(x[j]);
        const uint32_t in_nan = (u & 0x7fffffffu) > 0x7f800000u;
        const uint32_t got_nan = (g & 0x7fffffffu) > 0x7f800000u;
        flags |= (ours ^ ref) | (in_nan ? (got_nan ^ 1u) : (g ^ want));
      }
      if (flags == 0) continue;
      for (int64_t j = 0; j < n; ++j) {  // rare: find and record the mismatches
        const uint32_t u = static_cast<uint32_t>(base + j);
        uint16_t ours, ref;
        float want;
        const int r = check(u, x[j], ours, ref, want);
        if (r & 1) {
          ++conv_bad;
          conv_mm.add(u, ours, ref);
        }
        if (r & 2) {
          ++round_bad;
          round_mm.add(u, st::float_bits(x[j]), st::float_bits(want));
        }
      }
    }
  }
  EXPECT_EQ(conv_bad, 0) << conv_mm.report(conv_what, conv_bad, 4);
  EXPECT_EQ(round_bad, 0) << round_mm.report(round_what, round_bad, 8);
}

TEST(DtypeExhaustive, Bf16AllFloatsMatchCudaAndRoundInplace) {
  check_all_floats(
      st::DType::BF16, [](float f) { return st::float_to_bf16_bits(f); },
      [](float f) { return cuda_bf16_bits(f); },
      [](uint16_t h) { return st::bf16_bits_to_float(h); },
      "float_to_bf16_bits vs __float2bfloat16_rn", "round_inplace(BF16) vs round_bf16");
}

TEST(DtypeExhaustive, Fp16AllFloatsMatchCudaAndRoundInplace) {
  // fp16_bits_to_float (out of line) tabulated for speed; the table is the function itself.
  std::vector<float> widen(65536);
  for (uint32_t h = 0; h < 65536; ++h) widen[h] = st::fp16_bits_to_float(static_cast<uint16_t>(h));
  const float* w = widen.data();
  check_all_floats(
      st::DType::F16, [](float f) { return st::float_to_fp16_bits(f); },
      [](float f) { return cuda_fp16_bits(f); }, [w](uint16_t h) { return w[h]; },
      "float_to_fp16_bits vs __float2half_rn", "round_inplace(F16) vs round_fp16");
}

// round_inplace on one large array (its threaded path) equals the scalar rounding; the
// inputs are 2^24 + 5 patterns spread over the whole 32-bit range (all exponents, both
// signs, NaN and Inf) plus the halfway cases of both formats.
TEST(DtypeExhaustive, RoundInplaceThreadedMatchesScalar) {
  const size_t n = (size_t{1} << 24) + 5;
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(i * 2654435761u);  // odd multiplier: spread patterns
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;        // bf16 tie
    if (i % 4 == 2) u = (u & 0xffffe000u) | 0x1000u;        // fp16 (normal) tie
    in[i] = st::bits_float(u);
  }
  for (st::DType t : {st::DType::BF16, st::DType::F16}) {
    std::vector<float> x = in;
    st::round_inplace(t, x.data(), n);
    int64_t bad = 0;
    Mismatches mm;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (size_t i = 0; i < n; ++i) {
      const float want = st::round_to(t, in[i]);
      const bool ok = std::isnan(in[i]) ? std::isnan(x[i])
                                        : st::float_bits(x[i]) == st::float_bits(want);
      if (!ok) {
        ++bad;
        mm.add(st::float_bits(in[i]), st::float_bits(x[i]), st::float_bits(want));
      }
    }
    EXPECT_EQ(bad, 0) << mm.report(st::dtype_name(t), bad, 8);
  }
}

}  // namespace
