// GPU kernel tests (label gpu). Every test FAILS, never skips, without a GPU.
//  - The conversion kernels and the cuBLASLt GEMM against independent CPU references:
//    core/dtype.h's conversions (bit for bit) and a double-precision GEMM loop written here.
//    Outputs are poisoned (0xAB bytes) before each kernel so unwritten elements show up.
//  - The parity table: every Backend method, CUDA against the CPU backend, in fp32, bf16
//    and fp16, with a tolerance per method and its reason ("parity" below).
//  - Run-to-run determinism of every method (bit-identical outputs).
//  - Stochastic rounding in AdamW against a host implementation; the memory arena.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda/cuda_backend.h"
#include "cuda/stochastic_round.h"

namespace st {
namespace {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) {
      GTEST_FAIL() << "no CUDA GPU is present on this machine: the gpu-labelled tests need "
                      "one (run tools/gpu_check.sh on a GPU machine)";
    }
    be_ = make_cuda_backend(0);
  }

  Tensor to_device(const Tensor& host) {
    Tensor d = be_->alloc(host.shape(), host.dtype());
    be_->copy(d, host);
    return d;
  }
  Tensor to_host(const Tensor& dev) {
    Tensor h = Tensor::empty(dev.shape(), dev.dtype());
    be_->copy(h, dev);
    return h;
  }
  Tensor poisoned_device(const Shape& shape, DType dtype) {
    Tensor h = Tensor::empty(shape, dtype);
    std::memset(h.raw(), 0xAB, h.nbytes());
    return to_device(h);
  }

  std::unique_ptr<Backend> be_;
};

// ---------------------------------------------------------------- conversions

// Sweep index -> float bit pattern. The first 2^24 keep the low byte zero: every
// sign/exponent/high-mantissa prefix, exact bf16 ties (low half 0x8000) and fp16 ties
// (low 13 bits 0x1000). The next 2^24 repeat the prefixes with a scrambled low byte,
// so sticky bits just below and above the ties are exercised too.
constexpr uint64_t kSweep = uint64_t{1} << 25;
uint32_t sweep_pattern(uint64_t i) {
  const uint32_t prefix = static_cast<uint32_t>(i & 0xffffffu) << 8;
  if (i < (uint64_t{1} << 24)) return prefix;
  return prefix | static_cast<uint32_t>((i * 0x9E3779B1u) >> 24 & 0xffu);
}

std::vector<uint32_t> special_patterns() {
  std::vector<uint32_t> p = {
      0x00000000, 0x7f800000,                          // 0, Inf
      0x7fc00000, 0x7f800001, 0x7fffffff, 0x7f80ffff,  // quiet / signalling NaNs, payloads
      0x7fbfffff, 0x7f7fffff, 0x00000001, 0x007fffff,  // FLT_MAX, subnormal min / max
      0x00800000, 0x3f800000,                          // FLT_MIN, 1
      0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff,  // bf16 ties to even and neighbours
      0x7f7f7fff, 0x7f7f8000, 0x7f7f0000,              // bf16 overflow boundary
      0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001,  // 65504, <65520, 65520 (-> Inf), >
      0x47800000, 0x33800000, 0x33000000, 0x33000001,  // 65536, 2^-24, 2^-25 (tie -> 0)
      0x33c00000, 0x34200000, 0x387fe000, 0x387fffff,  // fp16 subnormal ties, below 2^-14
      0x38800000, 0x387ff000, 0x38801000, 0x38803000,  // fp16 min normal and ties near it
  };
  const size_t n = p.size();
  for (size_t i = 0; i < n; ++i) p.push_back(p[i] | 0x80000000u);  // the negatives
  Rng rng(20240607);
  for (int i = 0; i < (1 << 20); ++i) p.push_back(static_cast<uint32_t>(rng.next_u64() >> 32));
  return p;
}

// Runs fp32 -> fmt through the device kernel (device-to-device copy) chunk by chunk and
// compares every result bit for bit with the CPU conversion.
void check_narrowing(Backend& be, DType fmt, uint16_t (*cpu)(float)) {
  const std::vector<uint32_t> specials = special_patterns();
  const uint64_t total = kSweep + specials.size();
  const int64_t chunk = (int64_t{1} << 22) + 3;  // odd: the kernels' scalar tail runs too
  int64_t mismatches = 0;
  for (uint64_t lo = 0; lo < total; lo += chunk) {
    const int64_t n = static_cast<int64_t>(std::min<uint64_t>(chunk, total - lo));
    Tensor src = Tensor::empty({n}, DType::F32);
    auto* s = reinterpret_cast<uint32_t*>(src.data<float>());
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t k = lo + i;
      s[i] = k < kSweep ? sweep_pattern(k) : specials[k - kSweep];
    }
    Tensor dsrc = be.alloc({n}, DType::F32);
    be.copy(dsrc, src);
    Tensor host_poison = Tensor::empty({n}, fmt);
    std::memset(host_poison.raw(), 0xAB, host_poison.nbytes());
    Tensor ddst = be.alloc({n}, fmt);
    be.copy(ddst, host_poison);
    be.copy(ddst, dsrc);  // the kernel under test
    Tensor got = Tensor::empty({n}, fmt);
    be.copy(got, ddst);
    const uint16_t* g = got.data<uint16_t>();
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = cpu(bits_float(s[i]));
      if (g[i] != want && ++mismatches <= 10) {
        ADD_FAILURE() << dtype_name(fmt) << ": input 0x" << std::hex << s[i] << " -> GPU 0x" << g[i]
                      << ", CPU 0x" << want << std::dec;
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << total << " fp32 -> " << dtype_name(fmt) << " patterns";
  std::printf("fp32 -> %s: %llu patterns, %lld mismatches\n", dtype_name(fmt),
              static_cast<unsigned long long>(total), static_cast<long long>(mismatches));
}

// All 65536 16-bit patterns -> fp32 through the kernel, bit for bit.
void check_widening(Backend& be, DType fmt, float (*cpu)(uint16_t)) {
  const int64_t n = 65536;
  Tensor src = Tensor::empty({n}, fmt);
  for (int64_t i = 0; i < n; ++i) src.data<uint16_t>()[i] = static_cast<uint16_t>(i);
  Tensor dsrc = be.alloc({n}, fmt);
  be.copy(dsrc, src);
  Tensor poison = Tensor::empty({n}, DType::F32);
  std::memset(poison.raw(), 0xAB, poison.nbytes());
  Tensor ddst = be.alloc({n}, DType::F32);
  be.copy(ddst, poison);
  be.copy(ddst, dsrc);
  Tensor got = Tensor::empty({n}, DType::F32);
  be.copy(got, ddst);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t g = float_bits(got.data<float>()[i]);
    const uint32_t want = float_bits(cpu(static_cast<uint16_t>(i)));
    if (g != want && ++mismatches <= 10) {
      ADD_FAILURE() << dtype_name(fmt) << " 0x" << std::hex << i << " -> GPU 0x" << g << ", CPU 0x"
                    << want << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Gpu, ConvertFp32ToBf16MatchesCpuBitForBit) {
  check_narrowing(*be_, DType::BF16, float_to_bf16_bits);
}
TEST_F(Gpu, ConvertFp32ToFp16MatchesCpuBitForBit) {
  check_narrowing(*be_, DType::F16, float_to_fp16_bits);
}
TEST_F(Gpu, ConvertBf16ToFp32MatchesCpuBitForBit) {
  check_widening(*be_, DType::BF16, bf16_bits_to_float);
}
TEST_F(Gpu, ConvertFp16ToFp32MatchesCpuBitForBit) {
  check_widening(*be_, DType::F16, fp16_bits_to_float);
}

// Every copy path: host<->device with conversion (staged), device<->device on unaligned
// views (the kernels' scalar path), same-dtype copies, all against the CPU conversion.
TEST_F(Gpu, CopyPathsConvertLikeTheCpu) {
  const int64_t n = 1001;
  Rng rng(7);
  Tensor x = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = static_cast<float>(rng.normal() * 100.0);
  for (DType fmt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(fmt));
    Tensor want = Tensor::empty({n}, fmt);
    be_->copy(want, x);  // host -> host: the CPU conversion
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(want.data<uint16_t>()[i], fmt == DType::BF16
                                              ? float_to_bf16_bits(x.data<float>()[i])
                                              : float_to_fp16_bits(x.data<float>()[i]));
    }
    Tensor d16 = poisoned_device({n}, fmt);
    be_->copy(d16, x);  // host fp32 -> device 16-bit
    Tensor back = to_host(d16);
    EXPECT_EQ(std::memcmp(back.raw(), want.raw(), want.nbytes()), 0) << "host -> device";

    // Unaligned device views: 1 element into fp32, 3 into 16-bit.
    Tensor dbig32 = be_->alloc({n + 1}, DType::F32);
    Tensor dx = dbig32.flat(1, n, {n});
    be_->copy(dx, x);
    Tensor dbig16 = poisoned_device({n + 3}, fmt);
    be_->copy(dbig16.flat(3, n, {n}), dx);
    Tensor got = to_host(dbig16);
    EXPECT_EQ(std::memcmp(got.data<uint16_t>() + 3, want.raw(), want.nbytes()), 0) << "views";
    EXPECT_EQ(got.data<uint16_t>()[0], 0xABABu) << "the kernel wrote before its view";

    // 16-bit -> fp32 device -> host (staged), against the CPU widening.
    Tensor wide = Tensor::empty({n}, DType::F32);
    be_->copy(wide, d16);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = want.data<uint16_t>()[i];
      ASSERT_EQ(float_bits(wide.data<float>()[i]),
                float_bits(fmt == DType::BF16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h)));
    }
  }
}

TEST_F(Gpu, CopyErrorsAreClear) {
  Tensor d = be_->alloc({4}, DType::F32);
  Tensor h64 = Tensor::zeros({4}, DType::F64);
  try {
    be_->alloc({4}, DType::F64);
    ADD_FAILURE() << "fp64 device allocation did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(be_->copy(d, h64), Error);  // host fp64 -> device would narrow: refused
  EXPECT_THROW(be_->copy(be_->alloc({4}, DType::F16), be_->alloc({4}, DType::BF16)), Error);
  EXPECT_THROW(be_->copy(be_->alloc({5}, DType::F32), d), Error);
}

// The model reads the FP32 losses into a host fp64 tensor: device -> host fp64 widens exactly,
// from fp32, bf16 and fp16 storage.
TEST_F(Gpu, CopyDeviceToHostFp64WidensExactly) {
  const int64_t n = 333;
  Rng rng(3);
  Tensor x = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = static_cast<float>(rng.normal() * 10.0);
  for (DType fmt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(fmt));
    Tensor d = be_->alloc({n}, fmt);
    be_->copy(d, x);
    Tensor wide = Tensor::empty({n}, DType::F32), h64 = Tensor::empty({n}, DType::F64);
    be_->copy(wide, d);
    be_->copy(h64, d);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(h64.data<double>()[i], static_cast<double>(wide.data<float>()[i])) << i;
  }
}

TEST_F(Gpu, BackendIdentityAndAttentionBackends) {
  EXPECT_EQ(be_->device(), Device::CUDA);
  EXPECT_EQ(be_->name().rfind("cuda:", 0), 0u) << be_->name();
  EXPECT_EQ(be_->storage_dtype(DType::BF16), DType::BF16);
  EXPECT_EQ(be_->storage_dtype(DType::F16), DType::F16);
  EXPECT_EQ(be_->storage_dtype(DType::F32), DType::F32);
  EXPECT_THROW(be_->storage_dtype(DType::F64), Error);
  // Every attention kind has a GPU implementation (tests/test_gpu_attention.cpp,
  // tests/test_gpu_flash.cpp check them); make_attention dispatches on the kind.
  for (AttentionKind k :
       {AttentionKind::Baseline, AttentionKind::Flash, AttentionKind::StabilizedFlash}) {
    AttentionConfig c;
    c.kind = k;
    EXPECT_EQ(be_->make_attention(c)->name(), attention_kind_name(k));
  }
}

// ---------------------------------------------------------------- GEMM

// Host operands as float values, each exactly representable in the tested format.
struct GemmCase {
  int64_t N, C, OC;
  std::vector<float> inp, weight, bias;  // (N,C), (OC,C), (OC) or empty: no bias
};

// Fresh normal values rounded to fmt, never zero.
std::vector<float> normals(Rng& rng, int64_t n, double scale, DType fmt) {
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = round_to(fmt, static_cast<float>(rng.normal() * scale));
    while (x == 0.0f);
  }
  return v;
}

GemmCase random_case(int64_t N, int64_t C, int64_t OC, bool bias, DType fmt, uint64_t seed) {
  Rng rng(seed);
  GemmCase g{N, C, OC, normals(rng, N * C, 1.0, fmt), normals(rng, OC * C, 0.05, fmt), {}};
  if (bias) g.bias = normals(rng, OC, 0.5, fmt);
  return g;
}

// Small nonzero integers: every product and partial sum is an integer below 2^24, so the
// FP32 sum is exact in any order and only the final rounding to fmt can change it. Rows of
// one sign push sums past 256 (bf16) / 2048 (fp16), where odd integers are rounding ties.
GemmCase integer_case(int64_t N, int64_t C, int64_t OC, bool bias, uint64_t seed) {
  Rng rng(seed);
  // sign: +1 / -1 fixed, 0 random.
  const auto pick = [&](int max, int sign) {
    const float v = static_cast<float>(1 + rng.below(max));
    return sign > 0 || (sign == 0 && rng.below(2)) ? v : -v;
  };
  GemmCase g{N, C, OC, {}, {}, {}};
  for (int64_t i = 0; i < N * C; ++i) g.inp.push_back(pick(4, 1));
  // Weight rows: all positive, all negative, or mixed signs (near-cancelling sums).
  for (int64_t o = 0; o < OC; ++o) {
    const int sign = o % 3 == 0 ? 1 : o % 3 == 1 ? -1 : 0;
    for (int64_t c = 0; c < C; ++c) g.weight.push_back(pick(4, sign));
  }
  if (bias)
    for (int64_t o = 0; o < OC; ++o) g.bias.push_back(pick(8, 0));
  return g;
}

// Device tensor of storage fmt holding values, placed `offset` elements into its buffer.
Tensor upload(Backend& be, const std::vector<float>& values, const Shape& shape, DType fmt,
              int64_t offset) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor h = Tensor::empty({n}, DType::F32);
  std::memcpy(h.raw(), values.data(), h.nbytes());
  Tensor d = be.alloc({n + offset}, fmt).flat(offset, n, shape);
  be.copy(d.view({n}), h);
  return d;
}

std::vector<float> run_gemm(Backend& be, const GemmCase& g, DType fmt, int64_t offset = 0) {
  Tensor inp = upload(be, g.inp, {g.N, g.C}, fmt, offset);
  Tensor w = upload(be, g.weight, {g.OC, g.C}, fmt, offset);
  Tensor b = g.bias.empty() ? Tensor() : upload(be, g.bias, {g.OC}, fmt, offset);
  Tensor poison = Tensor::empty({g.N * g.OC + offset}, fmt);
  std::memset(poison.raw(), 0xAB, poison.nbytes());
  Tensor out_buf = be.alloc({g.N * g.OC + offset}, fmt);
  be.copy(out_buf, poison);
  Tensor out = out_buf.flat(offset, g.N * g.OC, {g.N, g.OC});
  be.matmul_forward(out, inp, w, b, fmt);
  Tensor host = Tensor::empty({g.N * g.OC}, DType::F32);
  be.copy(host, out.view({g.N * g.OC}));  // exact widening
  return std::vector<float>(host.data<float>(), host.data<float>() + g.N * g.OC);
}

// The independent reference: products and sums in double (exact for these inputs up to
// double's own rounding, far below any fmt ulp), plus sum |terms| for the error bound.
struct Reference {
  std::vector<double> exact, abs_sum;  // (N,OC)
};
Reference reference(const GemmCase& g) {
  Reference r{std::vector<double>(g.N * g.OC), std::vector<double>(g.N * g.OC)};
  // Rows in parallel; each output is still summed in one fixed order.
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t o = 0; o < g.OC; ++o) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < g.C; ++c) {
        const double p = static_cast<double>(g.inp[n * g.C + c]) * g.weight[o * g.C + c];
        s += p;
        a += std::fabs(p);
      }
      if (!g.bias.empty()) s += g.bias[o], a += std::fabs(g.bias[o]);
      r.exact[n * g.OC + o] = s;
      r.abs_sum[n * g.OC + o] = a;
    }
  }
  return r;
}

// x rounded once to fmt: round-to-odd at float precision, then the CPU's RNE to fmt
// (float keeps >= 2 extra bits over bf16/fp16, so the two steps equal one rounding).
float round_once(DType fmt, double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) != x && (float_bits(f) & 1u) == 0) f = std::nexttoward(f, x);
  return round_to(fmt, f);
}

double ulp_of(DType fmt, double x) {
  const int e = x == 0 ? -1000 : std::ilogb(x);
  if (fmt == DType::BF16) return std::ldexp(1.0, std::max(e, -126) - 7);
  if (fmt == DType::F16) return std::ldexp(1.0, std::max(e, -14) - 10);
  return std::ldexp(1.0, std::max(e, -126) - 23);
}

struct Stats {
  double max_abs = 0, max_rel = 0, max_ulps = 0, norm_got = 0, norm_ref = 0;
  int64_t not_rounded_ref = 0, violations = 0, n = 0;
};

// exact_required: got must equal the once-rounded reference bit for bit. Otherwise the
// bound is one fmt ulp plus the FP32 accumulation error bound gamma_{C+2} * sum|terms|:
// cuBLASLt adds in a different order than the reference, so the FP32 sum may differ from
// the exact one by that much, and rounding it (once, RNE, monotone) moves it at most one
// ulp further. The rounding point itself must not differ: the accumulation term is far
// below half an ulp except where the sum nearly cancels.
Stats compare(const std::vector<float>& got, const Reference& ref, DType fmt, int64_t C,
              bool exact_required) {
  const double k = static_cast<double>(C + 2), u = std::ldexp(1.0, -24);
  const double gamma = k * u / (1 - k * u);
  Stats s;
  s.n = static_cast<int64_t>(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = ref.exact[i], r = round_once(fmt, e), g = got[i];
    const double unit = std::max(ulp_of(fmt, r), std::isfinite(g) ? ulp_of(fmt, g) : 0.0);
    const double allowed = exact_required ? 0.0 : unit + gamma * ref.abs_sum[i];
    const double d = std::fabs(g - r);
    if (!(d <= allowed && std::isfinite(g)) && ++s.violations <= 10) {
      ADD_FAILURE() << "output " << i << ": GPU " << g << ", reference " << r << " (exact " << e
                    << "), off by " << d / unit << " ulp, allowed " << allowed / unit << " ulp";
    }
    s.not_rounded_ref += g != r;
    s.max_abs = std::max(s.max_abs, std::fabs(g - e));
    if (e != 0) s.max_rel = std::max(s.max_rel, std::fabs(g - e) / std::fabs(e));
    s.max_ulps = std::max(s.max_ulps, d / unit);
    s.norm_got += g * g;
    s.norm_ref += e * e;
  }
  s.norm_got = std::sqrt(s.norm_got);
  s.norm_ref = std::sqrt(s.norm_ref);
  return s;
}

void report(const char* label, const Stats& s) {
  std::printf(
      "%-34s max_abs %.3e  max_rel %.3e  max %.2f ulp  %lld/%lld differ from the "
      "once-rounded reference\n",
      label, s.max_abs, s.max_rel, s.max_ulps, static_cast<long long>(s.not_rounded_ref),
      static_cast<long long>(s.n));
  const std::string key(label);
  ::testing::Test::RecordProperty(key + ".max_abs", std::to_string(s.max_abs));
  ::testing::Test::RecordProperty(key + ".max_rel", std::to_string(s.max_rel));
  ::testing::Test::RecordProperty(key + ".max_ulps", std::to_string(s.max_ulps));
}

void expect_sane_norm(const Stats& s) {
  EXPECT_GT(s.norm_got, 0.0) << "all-zero output";
  EXPECT_NEAR(s.norm_got, s.norm_ref, 1e-2 * s.norm_ref);
}

struct Size {
  int64_t N, C, OC;
};
const Size kSizes[] = {{37, 72, 200}, {256, 768, 2304}};  // odd sizes; GPT-2's c_attn

TEST_F(Gpu, MatmulSmallIntegersExact) {
  for (DType fmt : {DType::BF16, DType::F16}) {
    for (const Size& z : kSizes) {
      for (bool bias : {false, true}) {
        const std::string label = std::string("int ") + dtype_name(fmt) + " " +
                                  std::to_string(z.N) + "x" + std::to_string(z.C) + "x" +
                                  std::to_string(z.OC) + (bias ? " +bias" : "");
        SCOPED_TRACE(label);
        const GemmCase g = integer_case(z.N, z.C, z.OC, bias, 11 + z.C);
        const Stats s = compare(run_gemm(*be_, g, fmt), reference(g), fmt, z.C, true);
        report(label.c_str(), s);
        EXPECT_EQ(s.violations, 0);
        expect_sane_norm(s);
      }
    }
  }
}

TEST_F(Gpu, MatmulRandomWithinOneUlpOfRoundedReference) {
  for (DType fmt : {DType::BF16, DType::F16, DType::F32}) {
    for (const Size& z : kSizes) {
      for (bool bias : {false, true}) {
        const std::string label = std::string("random ") + dtype_name(fmt) + " " +
                                  std::to_string(z.N) + "x" + std::to_string(z.C) + "x" +
                                  std::to_string(z.OC) + (bias ? " +bias" : "");
        SCOPED_TRACE(label);
        const GemmCase g = random_case(z.N, z.C, z.OC, bias, fmt, 1000 + z.OC + bias);
        const Stats s = compare(run_gemm(*be_, g, fmt), reference(g), fmt, z.C, false);
        report(label.c_str(), s);
        EXPECT_EQ(s.violations, 0);
        // A wrong rounding mode or a second rounding would move far more than 1% of the
        // outputs off the once-rounded value; FP32 reordering moves only near-ties.
        if (fmt != DType::F32) {
          EXPECT_LE(s.not_rounded_ref, s.n / 100);
        }
        expect_sane_norm(s);
      }
    }
  }
}

// dweight += dout^T . inp in BF16/FP16: the backend's model is dweight = round(init +
// round(sum)), the CPU backend's (layers/matmul_cpu.cpp), at every shape. It holds by
// construction (matmul.cu, "Rounding": a beta = 0 product, then one add), because cuBLASLt's
// own beta = 1 accumulation into a 16-bit D rounds once or twice depending on the algorithm
// its heuristic picks (H200, cuBLAS 13: twice with algo 66 at the aligned shapes, once at the
// parity test's odd shape). Checked at the aligned sizes and at that odd shape (N 111, C 100,
// OC 300, views 8 elements into their buffers): both models are counted against an FP64
// reference; the twice-rounded one must hold for >= 99% of the elements (the rest: FP32
// reordering near-ties of round(sum)), and every element within one ulp of the result plus
// one ulp of the product plus the FP32 accumulation bound. Beside it, the same counts for
// cuBLASLt's raw beta = 1 GEMM on the same inputs and the algorithm it chose are printed:
// the evidence for the construction (printed, not asserted: it is cuBLASLt's business).
TEST_F(Gpu, MatmulBackwardDweightRoundingModel) {
  struct DwSize {
    int64_t N, C, OC, offset;
  };
  const DwSize sizes[] = {{37, 72, 200, 0}, {256, 768, 2304, 0}, {111, 100, 300, 8}};
  for (DType fmt : {DType::BF16, DType::F16}) {
    for (const DwSize& z : sizes) {
      const std::string label = std::string("dweight ") + dtype_name(fmt) + " " +
                                std::to_string(z.N) + "x" + std::to_string(z.C) + "x" +
                                std::to_string(z.OC) + (z.offset ? " offset " : "") +
                                (z.offset ? std::to_string(z.offset) : "");
      SCOPED_TRACE(label);
      Rng rng(4242 + z.C + static_cast<int>(fmt));
      const std::vector<float> dout = normals(rng, z.N * z.OC, 0.1, fmt);  // (N,OC)
      const std::vector<float> inp = normals(rng, z.N * z.C, 1.0, fmt);    // (N,C)
      const std::vector<float> init = normals(rng, z.OC * z.C, 0.01, fmt);  // (OC,C)
      const int64_t n = z.OC * z.C;
      std::vector<double> sum(n, 0.0), abs_sum(n, 0.0);
#pragma omp parallel for schedule(static)
      for (int64_t o = 0; o < z.OC; ++o)
        for (int64_t r = 0; r < z.N; ++r)
          for (int64_t c = 0; c < z.C; ++c) {
            const double p = static_cast<double>(dout[r * z.OC + o]) * inp[r * z.C + c];
            sum[o * z.C + c] += p;
            abs_sum[o * z.C + c] += std::fabs(p);
          }
      const double k = static_cast<double>(z.N + 2), u = std::ldexp(1.0, -24);
      const double gamma = k * u / (1 - k * u);
      Tensor d_dout = upload(*be_, dout, {z.N, z.OC}, fmt, z.offset);
      Tensor d_inp = upload(*be_, inp, {z.N, z.C}, fmt, z.offset);
      // Counts of one result against both models; violations of the twice-rounded bound.
      struct Counts {
        int64_t once = 0, twice = 0, violations = 0;
      };
      const auto count = [&](const Tensor& d_dw, bool report_violations) {
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        Tensor host = Tensor::empty({n}, DType::F32);
        be_->copy(host, d_dw.view({n}));
        const float* got = host.data<float>();
        Counts c;
        for (int64_t i = 0; i < n; ++i) {
          const float rs = round_once(fmt, sum[i]);
          const float r1 = round_once(fmt, init[i] + sum[i]);
          const float r2 = round_once(fmt, init[i] + static_cast<double>(rs));
          c.once += got[i] == r1;
          c.twice += got[i] == r2;
          const double unit = std::max(ulp_of(fmt, r2), ulp_of(fmt, got[i]));
          const double allowed = unit + ulp_of(fmt, rs) + gamma * abs_sum[i];
          if (!(std::fabs(got[i] - r2) <= allowed) && ++c.violations <= 5 && report_violations)
            ADD_FAILURE() << label << ": element " << i << ": GPU " << got[i]
                          << ", twice-rounded " << r2 << ", once-rounded " << r1;
        }
        return c;
      };
      // The backend (what training runs).
      Tensor d_dw = upload(*be_, init, {z.OC, z.C}, fmt, z.offset);
      const Tensor weight = upload(*be_, init, {z.OC, z.C}, fmt, 0);  // its shape is what counts
      be_->matmul_backward(Tensor(), d_dw, Tensor(), d_dout, d_inp, weight, fmt);
      const Counts ours = count(d_dw, true);
      // cuBLASLt's own beta = 1 accumulation on the same operands (diagnostic).
      LtGemm gemm;
      Tensor d_raw = upload(*be_, init, {z.OC, z.C}, fmt, z.offset);
      const GemmOp g =
          LtGemm::dweight_op(d_raw.raw(), d_dout.raw(), d_inp.raw(), z.N, z.C, z.OC, fmt, 1.0f);
      const std::string algo = gemm.describe(g);
      gemm.matmul(g, nullptr);
      const Counts raw = count(d_raw, false);
      std::printf("%-38s backend: %.2f%% equal round(init + round(sum)), %.2f%% equal "
                  "round(init + sum), %lld beyond the bound | cuBLASLt beta = 1 (%s): %.2f%% / "
                  "%.2f%%\n",
                  label.c_str(), 100.0 * ours.twice / n, 100.0 * ours.once / n,
                  static_cast<long long>(ours.violations), algo.c_str(), 100.0 * raw.twice / n,
                  100.0 * raw.once / n);
      EXPECT_EQ(ours.violations, 0);
      EXPECT_GE(ours.twice, n - n / 100) << label;
    }
  }
}

// Operands 8 elements (16 bytes) into their buffers, as views into a flat parameter
// buffer are: cuBLASLt must get an algorithm that allows that alignment.
TEST_F(Gpu, MatmulOnOffsetViews) {
  const GemmCase g = integer_case(37, 72, 200, true, 5);
  const Stats s = compare(run_gemm(*be_, g, DType::BF16, 8), reference(g), DType::BF16, 72, true);
  EXPECT_EQ(s.violations, 0);
  expect_sane_norm(s);
}

TEST_F(Gpu, MatmulIsDeterministicRunToRun) {
  const GemmCase g = random_case(256, 768, 2304, true, DType::BF16, 99);
  const std::vector<float> a = run_gemm(*be_, g, DType::BF16);
  const std::vector<float> b = run_gemm(*be_, g, DType::BF16);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST_F(Gpu, MatmulRejectsBadOperands) {
  Tensor inp = be_->alloc({4, 8}, DType::BF16), w = be_->alloc({6, 8}, DType::BF16);
  Tensor out = be_->alloc({4, 6}, DType::BF16);
  EXPECT_THROW(be_->matmul_forward(be_->alloc({4, 5}, DType::BF16), inp, w, Tensor(), DType::BF16),
               Error);
  EXPECT_THROW(be_->matmul_forward(out, be_->alloc({4, 7}, DType::BF16), w, Tensor(), DType::BF16),
               Error);
  EXPECT_THROW(be_->matmul_forward(out, inp, w, be_->alloc({5}, DType::BF16), DType::BF16), Error);
  EXPECT_THROW(be_->matmul_forward(out, inp, w, Tensor(), DType::F16), Error);  // dtype
  EXPECT_THROW(
      be_->matmul_forward(out, Tensor::empty({4, 8}, DType::BF16), w, Tensor(), DType::BF16),
      Error);
  EXPECT_THROW(be_->matmul_forward(out, inp, w, Tensor(), DType::F64), Error);
}

// ---------------------------------------------------------------- parity table
//
// Every Backend method, CUDA against the CPU backend (make_backend("cpu"), the executable
// specification) in the same precision mode (fp32, bf16, fp16), on fresh random inputs that
// are never zero and are already representable in the compute format (so both backends see
// the same values). Outputs that a method overwrites are poisoned with NaN before the call;
// "+=" outputs start from the same random values on both sides. Every GPU tensor is a view
// with guard elements before and after it, which must be unchanged afterwards, and GPU
// inputs must be unchanged too. Per output: max abs error, max relative error, the
// norm-wise relative error and the largest error in ulps are printed ("parity ..." lines),
// the norm must be non-zero and every element finite, a "+=" output must have changed, and
// each element must satisfy |gpu - cpu| <= ulps * ulp(cpu) + floor * max|cpu| (or be
// bit-identical where the tolerance is exact), with the reason at each table entry.

enum class Kind { Act, F32 };           // compute-format storage on the GPU / FP32 on both
enum class Init { In, Poison, Accum };  // input / overwritten output / "+=" output

struct Tol {
  bool exact = true;
  double ulps_low = 0, ulps_f32 = 0;  // ulps of the output's format: bf16/fp16, or FP32
  double floor = 0;                   // times max|cpu| over the output
  // += outputs whose added term is rounded before the addition (dweight): that term may
  // round to a neighbour on one side, which moves the result by one ulp of the term.
  double addend_ulps = 0;  // ulps of the output's format at |cpu - initial value|
  double max_differ = 1;   // the largest fraction of elements that may differ at all
};
// Bit-identical: the kernel does the CPU's operations in the CPU's order.
constexpr Tol kExact{};
constexpr Tol close_to(double ulps_low, double ulps_f32, double floor) {
  return Tol{false, ulps_low, ulps_f32, floor};
}

struct Spec {
  std::string name;
  Shape shape;
  Kind kind = Kind::Act;
  Init init = Init::In;
  double scale = 1.0, shift = 0.0;
  bool positive = false;
  Tol tol = kExact;
  bool nonzero = true;   // the output's norm must be > 0 (false for zero())
  bool planted = false;  // an input the case itself changes before the call (all_finite)
};

using RunFn = std::function<std::vector<double>(Backend&, const std::vector<Tensor>&,
                                                const Tensor& ints, DType fmt)>;

struct Case {
  std::string method, variant;
  std::vector<Spec> specs;
  Shape ints_shape;        // host int32 tokens / targets; empty: none
  int64_t ints_range = 0;  // drawn from [0, ints_range)
  bool gemm = false;       // cuBLASLt operands: placed at the config's gemm offset
  RunFn run;
  double scalar_rel = 0;  // tolerance of the returned scalars (relative; 0: exact)
};

struct Cfg {
  const char* name;
  int64_t B, T, C, rows, maxT, OC, cls_rows, V, Vp;
  int64_t offset, gemm_offset;  // elements before each GPU view (1: misaligned)
};
// Odd sizes and misaligned views (scalar kernel paths, tails), GPT-2 124M widths with
// aligned views (128-bit paths, the real vocabulary), and a larger one for determinism.
const Cfg kOdd{"odd", 3, 37, 100, 67, 40, 300, 111, 997, 1001, 1, 8};
const Cfg kGpt2{"gpt2", 4, 64, 768, 1024, 64, 2304, 64, 50257, 50304, 0, 0};
const Cfg kLarge{"large", 8, 256, 768, 4096, 256, 2304, 64, 50257, 50304, 0, 0};

Spec in(std::string n, Shape s, double scale = 1.0, double shift = 0.0) {
  return Spec{std::move(n), std::move(s), Kind::Act, Init::In, scale, shift};
}
Spec out(std::string n, Shape s, Tol tol) {
  Spec x{std::move(n), std::move(s), Kind::Act, Init::Poison};
  x.tol = tol;
  return x;
}
Spec acc(std::string n, Shape s, Tol tol, double scale = 0.1) {
  Spec x{std::move(n), std::move(s), Kind::Act, Init::Accum, scale};
  x.tol = tol;
  return x;
}
Spec f32(Spec s) {
  s.kind = Kind::F32;
  return s;
}

std::vector<Case> make_cases(const Cfg& z, DType fmt) {
  const int64_t B = z.B, T = z.T, C = z.C, OC = z.OC, N = z.B * z.T, R = z.cls_rows;
  const bool f16 = fmt == DType::F16;
  std::vector<Case> cs;
  auto add = [&](std::string method, std::string variant, std::vector<Spec> specs, RunFn run) {
    Case c;
    c.method = std::move(method);
    c.variant = std::move(variant);
    c.specs = std::move(specs);
    c.run = std::move(run);
    cs.push_back(std::move(c));
    return &cs.back();
  };
  auto none = std::vector<double>{};

  // ---- memory
  add("zero", "", {[&] {
        Spec s = acc("t", {N, C}, kExact);
        s.nonzero = false;
        return s;
      }()},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
        be.zero(t[0]);
        return none;
      });
  add("copy", "device to device", {out("dst", {N, C}, kExact), in("src", {N, C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
        be.copy(t[0], t[1]);
        return none;
      });
  // fp32 master -> compute copy: one RNE rounding on both (CPU: FP32 storage rounded in place).
  add("round_copy", "fp32 -> fmt", {out("dst", {N, C}, kExact), f32(in("src", {N, C}, 0.3))},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.round_copy(t[0], t[1], f);
        return none;
      });

  // ---- encoder: the same FP32 add / the same sums in the same order as the CPU: exact.
  {
    Case* c = add(
        "encoder_forward", "",
        {out("out", {B, T, C}, kExact), in("wte", {z.rows, C}, 0.1), in("wpe", {z.maxT, C}, 0.02)},
        [=](Backend& be, const std::vector<Tensor>& t, const Tensor& tok, DType f) {
          be.encoder_forward(t[0], tok, t[1], t[2], f);
          return none;
        });
    c->ints_shape = {B, T};
    c->ints_range = z.rows;
    c = add("encoder_backward", "",
            {acc("dwte", {z.rows, C}, kExact, 0.01), acc("dwpe", {z.maxT, C}, kExact, 0.01),
             in("dout", {B, T, C}, 0.1)},
            [=](Backend& be, const std::vector<Tensor>& t, const Tensor& tok, DType f) {
              be.encoder_backward(t[0], t[1], t[2], tok, f);
              return none;
            });
    c->ints_shape = {B, T};
    c->ints_range = -z.rows;  // negative: half the ids from 8 frequent tokens (repeats)
  }

  // ---- layernorm
  // The row mean and variance are summed in another order (lane-strided + butterfly vs the
  // CPU's sequential loop): FP32 reassociation. The CPU's own sequential error dominates:
  // ~sqrt(C) 2^-24 relative for the sum of squares (rstd: ~5e-7 at C = 768, hence 32 FP32
  // ulps) and, for the mean of rows with a non-zero mean, up to C 2^-24 mean|x| in the worst
  // case (the floor: 1e-5 of the largest mean). out: an FP32 value a few ulps off may round
  // to the neighbouring bf16/fp16 value (1 ulp); the floor absorbs x - mean cancelling.
  add("layernorm_forward", "",
      {out("out", {B, T, C}, close_to(1, 8, 4e-6)), f32(out("mean", {B, T}, close_to(0, 8, 1e-5))),
       f32(out("rstd", {B, T}, close_to(0, 32, 0))), in("inp", {B, T, C}, 1.0, 0.3),
       in("weight", {C}, 0.1, 1.0), in("bias", {C}, 0.1)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], f);
        return none;
      });
  // The residual add fused into the layernorm forward: res exact (one add, one rounding),
  // out/mean/rstd as layernorm_forward (the emu suite checks the fused kernel is bit-identical
  // to the unfused pair).
  add("residual_layernorm_forward", "",
      {out("res", {B, T, C}, kExact), out("out", {B, T, C}, close_to(1, 8, 4e-6)),
       f32(out("mean", {B, T}, close_to(0, 8, 1e-5))), f32(out("rstd", {B, T}, close_to(0, 32, 0))),
       in("a", {B, T, C}, 1.0, 0.3), in("b", {B, T, C}, 0.5), in("weight", {C}, 0.1, 1.0),
       in("bias", {C}, 0.1)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.residual_layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], f);
        return none;
      });
  const Spec rstd_in = [&] {
    Spec s = f32(in("rstd", {B, T}, 0.1, 1.0));
    s.positive = true;
    return s;
  }();
  // dinp: the two row sums are reassociated (as forward) and the result cancels (dn - mean
  // - n*mean): floor 2e-6 of the largest gradient. dweight/dbias: column sums over N rows in
  // chunks of 64 (exact when N <= 64), FP32 reassociation over up to N terms.
  add("layernorm_backward", "",
      {acc("dinp", {B, T, C}, close_to(1, 16, 2e-6)), acc("dweight", {C}, close_to(1, 16, 1e-5)),
       acc("dbias", {C}, close_to(1, 16, 1e-5)), in("dout", {B, T, C}, 0.1),
       in("inp", {B, T, C}, 1.0, 0.3), in("weight", {C}, 0.1, 1.0),
       f32(in("mean", {B, T}, 0.05, 0.3)),
       rstd_in},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], f);
        return none;
      });

  // ... and with the next projection's bias gradient made in its pass: dnext = colsum of the
  // dinp it leaves (bias_backward's chunks vs the CPU's row order; dinp's own tolerance).
  add("layernorm_backward_dbias", "",
      {acc("dinp", {B, T, C}, close_to(1, 16, 2e-6)), acc("dweight", {C}, close_to(1, 16, 1e-5)),
       acc("dbias", {C}, close_to(1, 16, 1e-5)), acc("dnext", {C}, close_to(1, 64, 1e-5)),
       in("dout", {B, T, C}, 0.1), in("inp", {B, T, C}, 1.0, 0.3), in("weight", {C}, 0.1, 1.0),
       f32(in("mean", {B, T}, 0.05, 0.3)),
       rstd_in},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.layernorm_backward_dbias(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], f);
        return none;
      });

  // ---- matmul (cuBLASLt vs OpenBLAS): both accumulate in FP32 and round once, in different
  // orders (and cuBLASLt with FMA): bf16/fp16 results at most 1 ulp apart; FP32 results
  // within 2e-5 of the largest output (the typical reassociation error is ~1e-7 of it).
  const Tol kGemm = close_to(1, 4, 2e-5);
  for (bool bias : {true, false}) {
    Case* c = add("matmul_forward", bias ? "+bias" : "no bias",
                  {out("out", {B, T, OC}, kGemm), in("inp", {B, T, C}), in("weight", {OC, C}, 0.05),
                   in("bias", {OC}, 0.5)},
                  [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
                    be.matmul_forward(t[0], t[1], t[2], bias ? t[3] : Tensor(), f);
                    return none;
                  });
    c->gemm = true;
  }
  // dbias: the column-sum kernel (chunks of 64 rows, then the chunks) vs the CPU's row order.
  // dweight = round(dweight + round(product)) on both sides (layers/matmul_cpu.cpp): the
  // product's FP32 sums differ in order, so round(product) may land on its neighbour (one
  // ulp of the product) in the rare near-ties; a different rounding model (once instead of
  // twice) would move about a quarter of the elements, hence at most 1% may differ. That
  // count belongs to BF16/FP16 alone: in FP32 nothing is rounded to a coarser format, the
  // summation order alone makes most elements differ in their last bits (74-90% on the
  // H200), and FP32 keeps its ulp + norm bound.
  Tol kGemmAcc = kGemm;
  kGemmAcc.addend_ulps = 1;
  if (fmt != DType::F32) kGemmAcc.max_differ = 0.01;
  for (int v = 0; v < 3; ++v) {
    const bool dinp = v != 2, dbias = v != 1;
    std::vector<Spec> s = {out("dinp", {B, T, C}, kGemm),
                           acc("dweight", {OC, C}, kGemmAcc, 0.01),
                           acc("dbias", {OC}, close_to(1, 16, 1e-5)),
                           in("dout", {B, T, OC}, 0.1),
                           in("inp", {B, T, C}),
                           in("weight", {OC, C}, 0.05)};
    if (!dinp) s[0] = in("dinp (unused)", {1});
    if (!dbias) s[2] = in("dbias (unused)", {1});
    Case* c = add("matmul_backward",
                  v == 0   ? "full"
                  : v == 1 ? "no dbias"
                           : "no dinp",
                  s, [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
                    be.matmul_backward(dinp ? t[0] : Tensor(), t[1], dbias ? t[2] : Tensor(), t[3],
                                       t[4], t[5], f);
                    return none;
                  });
    c->gemm = true;
  }

  // ---- elementwise
  // GELU: the CPU's formula operation for operation, but tanhf (CUDA, <= 2 ulp) and the CPU's
  // tanh (layers/vec_math.h, <= 0.501 ulp) may differ in the last FP32 bits, which can move a bf16/fp16 rounding by 1 ulp; the floor
  // covers 1 + tanh(u) cancelling for large negative x.
  add("gelu_forward", "",
      {out("out", {N, 4 * C}, close_to(1, 8, 1e-6)), in("inp", {N, 4 * C}, 2.0)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_forward(t[0], t[1], f);
        return none;
      });
  // Backward: also 1 - tanh^2 cancels, hence the larger floor.
  const Tol kGeluB = close_to(1, 16, 4e-6);
  add("gelu_backward", "",
      {out("dinp", {N, 4 * C}, kGeluB), in("inp", {N, 4 * C}, 2.0), in("dout", {N, 4 * C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_backward(t[0], t[1], t[2], f);
        return none;
      });
  add("gelu_backward", "in place (dinp = dout)",
      {acc("dout", {N, 4 * C}, kGeluB, 1.0), in("inp", {N, 4 * C}, 2.0)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_backward(t[0], t[1], t[0], f);
        return none;
      });
  // The fc bias gradient made in the GELU backward's pass: dinp as gelu_backward; dbias the
  // column sums of dinp (bias_backward's chunks vs the CPU's row order, over values that may
  // each differ by the GELU tolerance). The emu suite checks it is bit-identical to the pair.
  const Tol kGeluDbias = close_to(1, 64, 1e-5);
  add("gelu_backward_dbias", "",
      {out("dinp", {N, 4 * C}, kGeluB), acc("dbias", {4 * C}, kGeluDbias, 0.1),
       in("inp", {N, 4 * C}, 2.0), in("dout", {N, 4 * C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_backward_dbias(t[0], t[1], t[2], t[3], f);
        return none;
      });
  add("gelu_backward_dbias", "in place (dinp = dout)",
      {acc("dout", {N, 4 * C}, kGeluB, 1.0), acc("dbias", {4 * C}, kGeluDbias, 0.1),
       in("inp", {N, 4 * C}, 2.0)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_backward_dbias(t[0], t[1], t[2], t[0], f);
        return none;
      });
  // matmul_backward's dbias alone: the column-sum kernel vs the CPU's row order.
  add("bias_backward", "",
      {acc("dbias", {OC}, close_to(1, 16, 1e-5), 0.1), in("dout", {B, T, OC}, 0.1)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.bias_backward(t[0], t[1], f);
        return none;
      });
  // One FP32 add, one rounding: exact.
  add("residual_forward", "",
      {out("out", {B, T, C}, kExact), in("a", {B, T, C}), in("b", {B, T, C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.residual_forward(t[0], t[1], t[2], f);
        return none;
      });
  add("residual_forward", "in place (out = a)",
      {acc("a", {B, T, C}, kExact, 1.0), in("b", {B, T, C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.residual_forward(t[0], t[0], t[1], f);
        return none;
      });

  // ---- classifier: the softmax sum is reduced in a block tree (vs the CPU's sequential loop
  // over V = 50257 terms, whose own error is ~1e-6..1e-5 relative) and expf/logf may differ
  // from glibc's in the last bit. losses: 16 FP32 ulps plus 4e-6 of the largest loss;
  // dlogits: 1 bf16/fp16 ulp; in FP32 the relative error of 1/sum carries into every
  // probability, covered by the floor (every p is far below the -1 of the target entries).
  const float dloss = (f16 ? 1024.0f : 1.0f) / static_cast<float>(R);  // fp16: loss-scaled
  const Tol kLoss = close_to(0, 16, 4e-6), kDlogits = close_to(1, 16, 1e-6);
  for (int v = 0; v < 3; ++v) {
    std::vector<Spec> s;
    if (v == 0)
      s = {f32(out("losses", {R}, kLoss)), out("dlogits", {R, z.Vp}, kDlogits),
           in("logits", {R, z.Vp}, 2.0)};
    if (v == 1)
      s = {f32(out("losses", {R}, kLoss)), acc("logits -> dlogits", {R, z.Vp}, kDlogits, 2.0)};
    if (v == 2) s = {f32(out("losses", {R}, kLoss)), in("logits", {R, z.Vp}, 2.0)};
    const int V = static_cast<int>(z.V);
    Case* c = add("crossentropy_forward_backward",
                  v == 0   ? "separate dlogits"
                  : v == 1 ? "in place (dlogits = logits)"
                           : "forward only",
                  s, [=](Backend& be, const std::vector<Tensor>& t, const Tensor& tg, DType f) {
                    if (v == 0) be.crossentropy_forward_backward(t[0], t[1], t[2], tg, V, dloss, f);
                    if (v == 1) be.crossentropy_forward_backward(t[0], t[1], t[1], tg, V, dloss, f);
                    if (v == 2)
                      be.crossentropy_forward_backward(t[0], Tensor(), t[1], tg, V, dloss, f);
                    return none;
                  });
    c->ints_shape = {R};
    c->ints_range = z.V;
  }

  // ---- reductions
  // sum_squares: the CPU's 64K chunks, FP64 sums in another order inside them; every square
  // is exact in FP64, so the relative difference is below 2 n 2^-53 (positive terms).
  {
    const int64_t n = N * C;
    Case* c = add("sum_squares", "", {in("x", {n})},
                  [](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
                    return std::vector<double>{be.sum_squares(t[0])};
                  });
    c->scalar_rel = 2.0 * static_cast<double>(n) * std::ldexp(1.0, -53);
    c = add("sum_squares", "fp32 tensor", {f32(in("x", {n}, 1e-3))},
            [](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
              return std::vector<double>{be.sum_squares(t[0])};
            });
    c->scalar_rel = 2.0 * static_cast<double>(n) * std::ldexp(1.0, -53);
  }
  // all_finite: a boolean, exact; Inf (as an fp16 overflow would leave) and NaN planted at
  // the two ends.
  for (int v = 0; v < 3; ++v) {
    Spec x = in("x", {N, C});
    x.planted = v != 0;
    add("all_finite",
        v == 0   ? "finite"
        : v == 1 ? "Inf last"
                 : "NaN first",
        {x}, [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
          const int64_t n = t[0].numel();
          Tensor one = Tensor::empty({1}, DType::F32);
          one.data<float>()[0] = v == 1 ? INFINITY : NAN;
          if (v != 0) be.copy(t[0].view({n}).flat(v == 1 ? n - 1 : 0, 1, {1}), one);
          return std::vector<double>{be.all_finite(t[0]) ? 1.0 : 0.0};
        });
  }

  // ---- AdamW: the CPU's operations in the CPU's order (host-side scalars by the same
  // expressions, IEEE sqrt and division, no FMA): master, m, v and the compute copy exact.
  {
    const int64_t n = 37 * C + 5;
    std::vector<Spec> s = {f32(acc("master", {n}, kExact, 0.05)), f32(acc("m", {n}, kExact, 1e-3)),
                           [&] {
                             Spec x = f32(acc("v", {n}, kExact, 1e-5));
                             x.positive = true;
                             return x;
                           }(),
                           in("grad", {n}, f16 ? 100.0 : 0.01)};
    const bool separate = fmt != DType::F32;  // fp32: the compute copy is master itself
    if (separate) s.push_back(out("param", {n}, kExact));
    add("adamw_update", separate ? "separate compute copy" : "param = master", s,
        [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
          AdamWArgs a;
          a.lr = 1e-3f;
          a.beta1 = 0.9f;
          a.beta2 = 0.95f;
          a.eps = 1e-8f;
          a.weight_decay = 0.1f;
          a.step = 7;
          a.grad_scale = f16 ? 1.0f / 1024.0f : 0.8f;
          be.adamw_update(t[0], separate ? t[4] : t[0], t[3], t[1], t[2], a, f);
          return none;
        });
  }
  return cs;
}

// Every Backend method the table must cover (alloc, storage_dtype and synchronize are used
// by the harness on every case; device/name and make_attention are checked above).
const char* const kMethods[] = {"zero",
                                "copy",
                                "round_copy",
                                "encoder_forward",
                                "encoder_backward",
                                "layernorm_forward",
                                "layernorm_backward",
                                "layernorm_backward_dbias",
                                "matmul_forward",
                                "matmul_backward",
                                "gelu_forward",
                                "gelu_backward",
                                "gelu_backward_dbias",
                                "bias_backward",
                                "residual_forward",
                                "residual_layernorm_forward",
                                "crossentropy_forward_backward",
                                "sum_squares",
                                "all_finite",
                                "adamw_update"};

uint64_t case_seed(const Cfg& z, DType fmt, size_t index) {
  return 0x5eed0000ull + 1000003ull * static_cast<uint64_t>(fmt) + 7919ull * index +
         static_cast<uint64_t>(z.C) * 31ull + static_cast<uint64_t>(z.B);
}

std::vector<float> draw(const Spec& s, DType fmt, Rng& rng) {
  const int64_t n = shape_numel(s.shape);
  std::vector<float> v(n);
  if (s.init == Init::Poison) {
    std::fill(v.begin(), v.end(), NAN);
    return v;
  }
  const DType f = s.kind == Kind::Act ? fmt : DType::F32;
  for (auto& x : v) {
    do {
      double r = rng.normal();
      if (s.positive) r = std::fabs(r);
      x = round_to(f, static_cast<float>(s.shift + s.scale * r));
    } while (x == 0.0f);
  }
  return v;
}

std::vector<int32_t> draw_ints(const Case& c, Rng& rng) {
  std::vector<int32_t> v(shape_numel(c.ints_shape));
  const int64_t range = std::llabs(c.ints_range);
  for (auto& x : v) {
    const bool frequent = c.ints_range < 0 && rng.below(2) == 0;
    x = static_cast<int32_t>(
        rng.below(static_cast<uint64_t>(frequent ? std::min<int64_t>(8, range) : range)));
  }
  return v;
}

constexpr int64_t kGuard = 8;
constexpr float kGuardValue = 7.0f;  // exact in every format

struct CaseRun {
  std::vector<Tensor> tensors;           // as handed to the method
  std::vector<Tensor> buffers;           // GPU: the whole buffer with its guards
  std::vector<std::vector<float>> init;  // the values each tensor started with
  std::vector<Tensor> result;            // host fp32 copies of every tensor afterwards
  std::vector<Tensor> raw;               // host copies in storage dtype (bit comparisons)
  std::vector<double> scalars;
};

CaseRun run_case(Backend& be, const Case& c, DType fmt, int64_t offset, uint64_t seed) {
  Rng rng(seed);
  CaseRun r;
  const bool gpu = be.device() == Device::CUDA;
  for (const Spec& s : c.specs) {
    std::vector<float> v = draw(s, fmt, rng);
    const int64_t n = static_cast<int64_t>(v.size());
    const DType storage = be.storage_dtype(s.kind == Kind::Act ? fmt : DType::F32);
    Tensor t, buf;
    if (gpu) {
      const int64_t total = offset + n + kGuard;
      std::vector<float> whole(total, kGuardValue);
      std::copy(v.begin(), v.end(), whole.begin() + offset);
      Tensor h = Tensor::empty({total}, DType::F32);
      std::memcpy(h.raw(), whole.data(), h.nbytes());
      buf = be.alloc({total}, storage);
      be.copy(buf, h);
      t = buf.flat(offset, n, s.shape);
    } else {
      t = Tensor::empty(s.shape, storage);
      std::memcpy(t.raw(), v.data(), t.nbytes());
    }
    r.tensors.push_back(t);
    r.buffers.push_back(buf);
    r.init.push_back(std::move(v));
  }
  Tensor ints;
  if (!c.ints_shape.empty()) {
    const std::vector<int32_t> iv = draw_ints(c, rng);
    ints = Tensor::empty(c.ints_shape, DType::I32);
    std::memcpy(ints.raw(), iv.data(), ints.nbytes());
  }
  r.scalars = c.run(be, r.tensors, ints, fmt);
  be.synchronize();
  for (const Tensor& t : r.tensors) {
    Tensor h = Tensor::empty(t.shape(), DType::F32);
    be.copy(h, t);
    r.result.push_back(h);
    Tensor raw = Tensor::empty(t.shape(), t.dtype());
    be.copy(raw, t);
    r.raw.push_back(raw);
  }
  return r;
}

// GPU only: the guard elements around each view and every input must be untouched.
void check_untouched(Backend& be, const Case& c, const CaseRun& r, int64_t offset,
                     const std::string& label) {
  for (size_t i = 0; i < c.specs.size(); ++i) {
    const Tensor& buf = r.buffers[i];
    Tensor h = Tensor::empty(buf.shape(), DType::F32);
    be.copy(h, buf);
    const float* p = h.data<float>();
    const int64_t n = r.tensors[i].numel(), total = buf.numel();
    int64_t bad = 0;
    for (int64_t k = 0; k < total; ++k)
      if ((k < offset || k >= offset + n) && p[k] != kGuardValue) ++bad;
    EXPECT_EQ(bad, 0) << label << ": " << c.specs[i].name << ": the kernel wrote outside its view";
    if (c.specs[i].init == Init::In && !c.specs[i].planted) {
      EXPECT_EQ(std::memcmp(p + offset, r.init[i].data(), n * sizeof(float)), 0)
          << label << ": input " << c.specs[i].name << " was modified";
    }
  }
}

struct Err {
  double max_abs = 0, max_rel = 0, max_ulps = 0, diff2 = 0, ref2 = 0, got2 = 0, moved2 = 0;
  int64_t differ = 0, violations = 0, nonfinite = 0, n = 0;
};

Err compare_output(const Spec& s, DType fmt, const float* g, const float* c, const float* init,
                   const std::string& label) {
  Err e;
  e.n = shape_numel(s.shape);
  const DType uf = s.kind == Kind::Act ? fmt : DType::F32;
  const double ulps = uf == DType::F32 ? s.tol.ulps_f32 : s.tol.ulps_low;
  double maxref = 0;
  for (int64_t i = 0; i < e.n; ++i) maxref = std::max(maxref, std::fabs(static_cast<double>(c[i])));
  for (int64_t i = 0; i < e.n; ++i) {
    const double gi = g[i], ci = c[i];
    if (!std::isfinite(gi)) ++e.nonfinite;
    const double d = std::fabs(gi - ci);
    const double unit = ulp_of(uf, std::max(std::fabs(ci), 1e-300));
    const double addend =
        init && s.tol.addend_ulps > 0
            ? s.tol.addend_ulps * ulp_of(uf, std::max(std::fabs(ci - init[i]), 1e-300))
            : 0.0;
    const bool ok = s.tol.exact ? (gi == ci) : (d <= ulps * unit + s.tol.floor * maxref + addend);
    if (!ok && ++e.violations <= 5) {
      ADD_FAILURE() << label << ": element " << i << ": GPU " << gi << ", CPU " << ci << " ("
                    << d / unit << " ulp, allowed " << (s.tol.exact ? 0.0 : ulps) << " ulp + "
                    << s.tol.floor << " * " << maxref << ")";
    }
    e.differ += gi != ci;
    e.max_abs = std::max(e.max_abs, d);
    if (ci != 0) e.max_rel = std::max(e.max_rel, d / std::fabs(ci));
    e.max_ulps = std::max(e.max_ulps, d / unit);
    e.diff2 += d * d;
    e.ref2 += ci * ci;
    e.got2 += gi * gi;
    if (init) e.moved2 += (gi - init[i]) * (gi - init[i]);
  }
  return e;
}

std::string case_label(const char* what, DType fmt, const Cfg& z, const Case& c) {
  std::string l = std::string(what) + " " + dtype_name(fmt) + " " + z.name + " " + c.method;
  if (!c.variant.empty()) l += " (" + c.variant + ")";
  return l;
}

bool is_output(const Spec& s) {
  return s.init != Init::In;
}

class GpuParity : public Gpu {
 protected:
  void SetUp() override {
    Gpu::SetUp();
    cpu_ = make_backend("cpu");
  }
  std::unique_ptr<Backend> cpu_;
};

void parity(Backend& cpu, Backend& gpu, DType fmt, const Cfg& z, std::set<std::string>& covered) {
  const std::vector<Case> cases = make_cases(z, fmt);
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    covered.insert(c.method);
    const std::string label = case_label("parity", fmt, z, c);
    SCOPED_TRACE(label);
    const uint64_t seed = case_seed(z, fmt, ci);
    const int64_t offset = c.gemm ? z.gemm_offset : z.offset;
    CaseRun want, got;
    try {
      want = run_case(cpu, c, fmt, 0, seed);
      got = run_case(gpu, c, fmt, offset, seed);
    } catch (const std::exception& e) {
      ADD_FAILURE() << label << " threw: " << e.what();
      continue;
    }
    check_untouched(gpu, c, got, offset, label);
    for (size_t i = 0; i < c.specs.size(); ++i) {
      const Spec& s = c.specs[i];
      if (!is_output(s)) continue;
      const std::string ol = label + " " + s.name;
      const Err e =
          compare_output(s, fmt, got.result[i].data<float>(), want.result[i].data<float>(),
                         s.init == Init::Accum ? got.init[i].data() : nullptr, ol);
      const double norm_rel = e.ref2 > 0 ? std::sqrt(e.diff2 / e.ref2) : std::sqrt(e.diff2);
      std::printf("%-78s max_abs %.2e max_rel %.2e norm_rel %.2e max %.2f ulp, %lld/%lld differ\n",
                  ol.c_str(), e.max_abs, e.max_rel, norm_rel, e.max_ulps,
                  static_cast<long long>(e.differ), static_cast<long long>(e.n));
      ::testing::Test::RecordProperty(ol + ".max_abs", std::to_string(e.max_abs));
      ::testing::Test::RecordProperty(ol + ".max_rel", std::to_string(e.max_rel));
      EXPECT_EQ(e.violations, 0) << ol;
      EXPECT_LE(e.differ, s.tol.max_differ * e.n) << ol << ": too many elements differ";
      EXPECT_EQ(e.nonfinite, 0) << ol << ": non-finite outputs (an element left poisoned?)";
      if (s.nonzero) {
        EXPECT_GT(e.got2, 0.0) << ol << ": all-zero output";
      }
      if (s.init == Init::Accum) {
        EXPECT_GT(e.moved2, 0.0) << ol << ": the += output did not change";
      }
    }
    ASSERT_EQ(want.scalars.size(), got.scalars.size());
    for (size_t i = 0; i < got.scalars.size(); ++i) {
      const double g = got.scalars[i], w = want.scalars[i];
      const double rel = w != 0 ? std::fabs(g - w) / std::fabs(w) : std::fabs(g - w);
      std::printf("%-78s GPU %.17g CPU %.17g rel %.2e (allowed %.2e)\n", label.c_str(), g, w, rel,
                  c.scalar_rel);
      ::testing::Test::RecordProperty(label + ".rel", std::to_string(rel));
      if (c.scalar_rel == 0) {
        EXPECT_EQ(g, w) << label;
      } else {
        EXPECT_LE(rel, c.scalar_rel) << label;
        EXPECT_GT(g, 0.0) << label;
      }
    }
  }
}

void expect_all_methods(const std::set<std::string>& covered) {
  for (const char* m : kMethods) EXPECT_EQ(covered.count(m), 1u) << "no parity case for " << m;
}

TEST_F(GpuParity, EveryMethodMatchesTheCpuBackendFp32) {
  std::set<std::string> covered;
  for (const Cfg* z : {&kOdd, &kGpt2}) parity(*cpu_, *be_, DType::F32, *z, covered);
  expect_all_methods(covered);
}
TEST_F(GpuParity, EveryMethodMatchesTheCpuBackendBf16) {
  std::set<std::string> covered;
  for (const Cfg* z : {&kOdd, &kGpt2}) parity(*cpu_, *be_, DType::BF16, *z, covered);
  expect_all_methods(covered);
}
TEST_F(GpuParity, EveryMethodMatchesTheCpuBackendFp16) {
  std::set<std::string> covered;
  for (const Cfg* z : {&kOdd, &kGpt2}) parity(*cpu_, *be_, DType::F16, *z, covered);
  expect_all_methods(covered);
}

// ---------------------------------------------------------------- determinism

// Every method twice on the same inputs (fresh buffers, same values): outputs bit-identical,
// in each precision and at sizes where the reductions have many blocks and chunks.
TEST_F(Gpu, EveryMethodIsBitIdenticalRunToRun) {
  for (DType fmt : {DType::F32, DType::BF16, DType::F16}) {
    for (const Cfg* z : {&kOdd, &kGpt2, &kLarge}) {
      const std::vector<Case> cases = make_cases(*z, fmt);
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        const std::string label = case_label("determinism", fmt, *z, c);
        SCOPED_TRACE(label);
        const uint64_t seed = case_seed(*z, fmt, ci) ^ 0xd00dull;
        const int64_t offset = c.gemm ? z->gemm_offset : z->offset;
        CaseRun a, b;
        try {
          a = run_case(*be_, c, fmt, offset, seed);
          b = run_case(*be_, c, fmt, offset, seed);
        } catch (const std::exception& e) {
          ADD_FAILURE() << label << " threw: " << e.what();
          continue;
        }
        int64_t differing = 0;
        for (size_t i = 0; i < c.specs.size(); ++i) {
          if (!is_output(c.specs[i])) continue;
          const Tensor& x = a.raw[i];
          const Tensor& y = b.raw[i];
          if (std::memcmp(x.raw(), y.raw(), x.nbytes()) != 0) {
            ++differing;
            ADD_FAILURE() << label << ": output " << c.specs[i].name << " differs between two runs";
          }
        }
        for (size_t i = 0; i < a.scalars.size(); ++i) {
          uint64_t ba, bb;
          std::memcpy(&ba, &a.scalars[i], 8);
          std::memcpy(&bb, &b.scalars[i], 8);
          if (ba != bb) {
            ++differing;
            ADD_FAILURE() << label << ": scalar " << a.scalars[i] << " vs " << b.scalars[i];
          }
        }
        if (differing == 0 && fmt == DType::BF16)
          std::printf("%-78s bit-identical\n", label.c_str());
      }
    }
  }
}

// ---------------------------------------------------------------- stochastic rounding

// The host implementation of cuda/stochastic_round.h with core/dtype.h's conversions.
uint16_t host_sr(DType fmt, float x, uint32_t r24) {
  if (fmt == DType::BF16)
    return sr::stochastic_round(x, float_to_bf16_bits(x), r24, bf16_bits_to_float);
  return sr::stochastic_round(x, float_to_fp16_bits(x), r24, fp16_bits_to_float);
}

TEST(StochasticRounding, HostFunctionIsUnbiasedAndStaysBetweenNeighbours) {
  // 1 + 2^-10 lies 1/8 of the way from 1 to the next bf16 value (1 + 2^-7).
  const float x = 1.0f + std::ldexp(1.0f, -10);
  int64_t up = 0;
  const int64_t n = 200000;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = host_sr(DType::BF16, x, sr::random24(42, 3, static_cast<uint64_t>(i)));
    ASSERT_TRUE(h == 0x3f80 || h == 0x3f81) << std::hex << h;
    up += h == 0x3f81;
  }
  EXPECT_NEAR(static_cast<double>(up) / n, 0.125, 0.004);
  // Representable values, Inf and NaN are unchanged; beyond the largest finite fp16 value
  // the result is that value, never Inf.
  for (uint32_t r : {0u, 0x7fffffu, 0xffffffu}) {
    EXPECT_EQ(host_sr(DType::BF16, 1.5f, r), float_to_bf16_bits(1.5f));
    EXPECT_EQ(host_sr(DType::F16, INFINITY, r), float_to_fp16_bits(INFINITY));
    EXPECT_EQ(host_sr(DType::F16, 65519.0f, r), 0x7bffu);
    EXPECT_EQ(host_sr(DType::F16, -70000.0f, r), 0xfbffu);
  }
  EXPECT_EQ(host_sr(DType::BF16, NAN, 5), 0x7fffu);
  // A tiny negative value rounds to -0 or to minus the smallest fp16 subnormal.
  const uint16_t t = host_sr(DType::F16, -1e-8f, 0);
  EXPECT_TRUE(t == 0x8000u || t == 0x8001u) << std::hex << t;
}

// AdamW with stochastic rounding on: master/m/v as the CPU backend's (exact), the compute
// copy as the host implementation of the same hash and rounding, bit for bit; the random
// stream is indexed by the view's offset in its buffer, as a flat parameter buffer gives.
TEST_F(GpuParity, AdamwStochasticRoundingMatchesTheHostImplementation) {
  auto& cuda = dynamic_cast<CudaBackend&>(*be_);
  const uint64_t seed = 1234567;
  for (DType fmt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(fmt));
    const int64_t n = 100003, at = 517;  // the view starts `at` elements into its buffer
    Rng rng(99 + static_cast<uint64_t>(fmt));
    std::vector<float> master(n), grad(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      master[i] = static_cast<float>(0.05 * rng.normal());
      grad[i] = round_to(fmt, static_cast<float>(0.01 * rng.normal()));
      m[i] = static_cast<float>(1e-3 * rng.normal());
      v[i] = static_cast<float>(1e-5 * std::fabs(rng.normal()));
    }
    auto host = [&](const std::vector<float>& x) {
      Tensor t = Tensor::empty({n}, DType::F32);
      std::memcpy(t.raw(), x.data(), t.nbytes());
      return t;
    };
    AdamWArgs a;
    a.lr = 1e-3f;
    a.weight_decay = 0.1f;
    a.step = 11;
    // CPU: round-to-nearest compute copy, but master/m/v are what the GPU must produce.
    Tensor cm = host(master), cp = host(master), cg = host(grad), cmm = host(m), cv = host(v);
    cpu_->adamw_update(cm, cp, cg, cmm, cv, a, fmt);
    // GPU.
    Tensor gm = to_device(host(master)), gg = be_->alloc({n}, fmt), gmm = to_device(host(m)),
           gv = to_device(host(v));
    be_->copy(gg, host(grad));
    Tensor pbuf = be_->alloc({n + at}, fmt);
    Tensor gp = pbuf.flat(at, n, {n});
    ASSERT_EQ(gp.offset(), static_cast<size_t>(at));
    cuda.set_stochastic_rounding(true, seed);
    be_->adamw_update(gm, gp, gg, gmm, gv, a, fmt);
    cuda.set_stochastic_rounding(false);
    Tensor got_master = to_host(gm), got_p = to_host(gp);
    EXPECT_EQ(std::memcmp(got_master.raw(), cm.raw(), cm.nbytes()), 0) << "master";
    EXPECT_EQ(std::memcmp(to_host(gmm).raw(), cmm.raw(), cmm.nbytes()), 0) << "m";
    EXPECT_EQ(std::memcmp(to_host(gv).raw(), cv.raw(), cv.nbytes()), 0) << "v";
    int64_t mismatches = 0, not_nearest = 0;
    const float* pm = cm.data<float>();
    const uint16_t* pg = got_p.data<uint16_t>();
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want =
          host_sr(fmt, pm[i], sr::random24(seed, static_cast<uint64_t>(a.step), at + i));
      if (pg[i] != want && ++mismatches <= 5)
        ADD_FAILURE() << "element " << i << ": GPU 0x" << std::hex << pg[i] << ", host 0x" << want;
      not_nearest +=
          pg[i] != (fmt == DType::BF16 ? float_to_bf16_bits(pm[i]) : float_to_fp16_bits(pm[i]));
    }
    EXPECT_EQ(mismatches, 0);
    // Stochastic rounding leaves the nearest value for a good share of the elements.
    EXPECT_GT(not_nearest, n / 20);
    std::printf("stochastic rounding %s: %lld of %lld not round-to-nearest, %lld mismatches\n",
                dtype_name(fmt), static_cast<long long>(not_nearest), static_cast<long long>(n),
                static_cast<long long>(mismatches));
  }
}

// ---------------------------------------------------------------- memory arena

// A training-step-like sequence of allocations and kernels: after the first rounds, the same
// requests are served from the arena's free list with no further cudaMalloc.
TEST_F(Gpu, ArenaMakesNoCudaMallocInSteadyState) {
  auto& cuda = dynamic_cast<CudaBackend&>(*be_);
  const int64_t N = 256, C = 768, V = 50257, Vp = 50304;
  Rng rng(5);
  auto random = [&](const Shape& s, DType d) {
    Tensor h = Tensor::empty(s, DType::F32);
    for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = static_cast<float>(rng.normal());
    Tensor t = be_->alloc(s, d);
    be_->copy(t, h);
    return t;
  };
  Tensor w = random({Vp, C}, DType::BF16), x = random({N, C}, DType::BF16);
  Tensor tokens = Tensor::empty({N}, DType::I32);
  for (int64_t i = 0; i < N; ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>(i * 7 % V);
  auto step = [&] {
    Tensor logits = be_->alloc({N, Vp}, DType::BF16), losses = be_->alloc({N}, DType::F32);
    Tensor dx = be_->alloc({N, C}, DType::BF16), dw = be_->alloc({Vp, C}, DType::BF16);
    Tensor mean = be_->alloc({N}, DType::F32), rstd = be_->alloc({N}, DType::F32);
    Tensor ln = be_->alloc({N, C}, DType::BF16);
    Tensor lw = random({C}, DType::BF16), lb = random({C}, DType::BF16);
    be_->zero(dw);
    be_->layernorm_forward(ln, mean, rstd, x, lw, lb, DType::BF16);
    be_->matmul_forward(logits, ln, w, Tensor(), DType::BF16);
    be_->crossentropy_forward_backward(losses, logits, logits, tokens, static_cast<int>(V),
                                       1.0f / N, DType::BF16);
    be_->matmul_backward(dx, dw, Tensor(), logits, ln, w, DType::BF16);
    EXPECT_GT(be_->sum_squares(dw), 0.0);
    EXPECT_TRUE(be_->all_finite(dx));
    be_->synchronize();
  };
  step();
  step();  // two rounds: the free list settles into the same block for the same request
  const ArenaStats first = cuda.memory_stats();
  for (int i = 0; i < 3; ++i) step();
  const ArenaStats later = cuda.memory_stats();
  std::printf(
      "arena: %lld cudaMalloc calls, %.1f MiB reserved, peak %.1f MiB in use, %lld of "
      "%lld allocations reused\n",
      static_cast<long long>(later.cuda_malloc_calls), later.reserved_bytes / 1048576.0,
      later.peak_in_use_bytes / 1048576.0, static_cast<long long>(later.reused),
      static_cast<long long>(later.allocations));
  EXPECT_EQ(later.cuda_malloc_calls, first.cuda_malloc_calls) << "cudaMalloc in steady state";
  EXPECT_GT(later.reused, first.reused);
  EXPECT_EQ(later.reserved_bytes, first.reserved_bytes);
}

// Device tensors may outlive the backend that allocated them.
TEST_F(Gpu, TensorsMayOutliveTheirBackend) {
  Tensor keep;
  {
    std::unique_ptr<Backend> other = make_cuda_backend(0);
    keep = other->alloc({1000}, DType::BF16);
    other->zero(keep);
    other->synchronize();
  }
  Tensor h = Tensor::empty({1000}, DType::F32);
  be_->copy(h, keep);
  EXPECT_EQ(h.data<float>()[999], 0.0f);
  keep = Tensor();  // released into the (still alive) arena of the destroyed backend
}

// Aliasing the kernels cannot honour is refused with a message, not computed wrongly.
TEST_F(Gpu, UnsupportedAliasingIsRefused) {
  Tensor buf = be_->alloc({2 * 64}, DType::BF16);
  be_->zero(buf);
  Tensor a = buf.flat(0, 64, {64}), b = buf.flat(8, 64, {64});
  EXPECT_THROW(be_->gelu_forward(b, a, DType::BF16), Error);  // partial overlap
  Tensor x = be_->alloc({4, 16}, DType::BF16), w = be_->alloc({16}, DType::BF16);
  Tensor st = be_->alloc({4}, DType::F32);
  be_->zero(x);
  be_->zero(w);
  EXPECT_THROW(be_->layernorm_forward(x, st, be_->alloc({4}, DType::F32), x, w, w, DType::BF16),
               Error);                                    // in place
  EXPECT_NO_THROW(be_->gelu_forward(a, a, DType::BF16));  // exactly in place is fine
}

}  // namespace
}  // namespace st
