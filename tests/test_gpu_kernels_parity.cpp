// The GPU parity table run (every Backend method, CUDA against the CPU backend, in fp32, bf16
// and fp16; the cases and the rules in test_gpu_kernels_cases.cpp),
// run-to-run determinism of every method, stochastic rounding in AdamW against a host
// implementation, and the memory arena. Part of test_gpu_kernels; label gpu: every test
// FAILS, never skips, without a GPU.
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
#include "gpu_test_util.h"
#include "test_gpu_kernels.h"

namespace st {
namespace {

using namespace gpu_kernels;

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
