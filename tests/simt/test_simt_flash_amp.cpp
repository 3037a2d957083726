// The O~ amplifier in the CUDA flash kernels (cuda/flash_fwd.cuh, AMP) run by the SIMT
// emulator through the CUDA class's own plan (cuda/flash_plan.cu), against the CPU lab's
// flash_forward (head_forward per head) on the same inputs: the cases, inputs and why they
// are bit for bit in tests/flash_amp_cases.h (the GPU runs the same: test_gpu_flash.cpp,
// GpuFlash.AmplifierMatchesTheLab). Label emu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/attention.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda/flash_launch.cuh"
#include "cuda/flash_plan.h"
#include "flash_amp_cases.h"
#include "simt/simt.h"
#include "simt/simt_test_util.h"

namespace st {
namespace {

using amp_test::Case;
using amp_test::Dims;
using amp_test::Lab;
using simt_test::Buf;
using simt_test::dev;
using simt_test::two_schedules;

// The kernels as FlashAttentionCuda runs them (flash_plan.cu), under two schedules.
std::vector<Buf> run_kernels(const AttentionConfig& cfg, const Dims& d, DType fmt,
                             const std::vector<float>& qkv_host) {
  const size_t n_out = static_cast<size_t>(d.B) * d.T * d.C();
  return two_schedules([&] {
    const Buf qkv = dev(qkv_host, fmt);
    const Buf out(fmt, n_out), lse(DType::F32, static_cast<size_t>(d.B) * d.NH * d.T),
        o32(DType::F32, n_out);
    flash::Buffers b;
    b.qkv = qkv.p();
    b.out = out.p();
    b.lse = lse.f();
    b.saved = o32.p();
    flash::run_forward(cfg, flash::resolve_numerics(cfg, fmt), fmt, {d.B, d.T, d.NH, d.hs}, b,
                       nullptr);
    return std::vector<Buf>{out, lse, o32};
  });
}

std::vector<double> values(const Buf& b) {
  std::vector<double> v(b.count);
  for (size_t i = 0; i < b.count; ++i) v[i] = b.get(i);
  return v;
}

class SimtFlashAmp : public ::testing::TestWithParam<Case> {};

TEST_P(SimtFlashAmp, ForwardMatchesTheLab) {
  const Case& c = GetParam();
  const Dims d{c.B, c.T, c.NH, c.hs};
  const std::vector<float> qkv = c.exact ? amp_test::exact_inputs(d, c.fmt, c.bk, c.seed)
                                         : amp_test::random_inputs(d, c.fmt, c.seed);
  const AttentionConfig cfg = amp_test::config_of(c);
  const Lab lab = amp_test::run_lab(cfg, d, c.fmt, qkv);
  amp_test::check_premises("simt flash amp", c, qkv, lab);
  if (HasFatalFailure()) return;

  const std::vector<Buf> got = run_kernels(cfg, d, c.fmt, qkv);
  ASSERT_EQ(got.size(), 3u);
  // Exact inputs: every element the lab's bits. Random (accum fp32): O within 4 ulps of fmt
  // and the FP32 O within 4.5 (half an ulp from O's own rounding), lse within 5e-5 (1 +
  // max|lse|), as test_simt_flash.cpp's parity cases.
  const char* who = "simt flash amp";
  amp_test::compare(who, c, "O", values(got[0]), lab.o, c.fmt, 4);
  amp_test::compare(who, c, "o32", values(got[2]), lab.o32, c.fmt, 4.5);
  double max_lse = 0;
  for (double v : lab.lse) max_lse = std::max(max_lse, std::fabs(v));
  amp_test::compare(who, c, "lse", values(got[1]), lab.lse, DType::F32,
                    5e-5 * (1 + max_lse) / amp_test::ulp_at(max_lse, DType::F32));
}

INSTANTIATE_TEST_SUITE_P(Cases, SimtFlashAmp, ::testing::ValuesIn(amp_test::kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(SimtFlashAmpInputs, ExpMarginsOfTheInputs) { amp_test::check_exp_margins(); }

// What the CUDA kernels refuse, one line naming the key: untied_matched, tie_break, and an
// amplifier on the sm90 kernel.
TEST(SimtFlashAmpInputs, RefusedSettingsNameTheKey) {
  const auto message = [](const AttentionConfig& cfg) -> std::string {
    try {
      flash::resolve_numerics(cfg, DType::BF16);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  AttentionConfig cfg;
  cfg.kind = AttentionKind::Flash;
  cfg.accum = DType::BF16;
  cfg.o_tilde_gain = 64;
  EXPECT_EQ(message(cfg), "");
  cfg.o_tilde_scope = OTildeScope::UntiedMatched;
  EXPECT_NE(message(cfg).find("attention.o_tilde_scope = untied_matched is CPU only"),
            std::string::npos) << message(cfg);
  cfg.o_tilde_scope = OTildeScope::Tied;
  cfg.cuda_kernel = FlashKernel::Sm90;
  EXPECT_NE(message(cfg).find("attention.cuda_kernel: mma_sync"), std::string::npos) << message(cfg);
  cfg.cuda_kernel = FlashKernel::MmaSync;
  cfg.o_tilde_gain = 0;
  cfg.o_tilde_scope = OTildeScope::All;
  cfg.tie_break = 0x1p-8;
  EXPECT_NE(message(cfg).find("attention.tie_break"), std::string::npos) << message(cfg);
}

}  // namespace
}  // namespace st
