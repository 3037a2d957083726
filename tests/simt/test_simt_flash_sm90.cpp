// The Hopper flash kernels (cuda/flash_fwd_sm90.cuh, flash_bwd_sm90.cuh) run by the SIMT
// emulator against the mma.sync kernels and the CPU lab, and the flash launchers' refusals
// of unsupported shapes and tiles; the emulated plan, the CPU side and the comparisons are
// tests/simt/simt_flash_test_util.h's, the tolerances those of test_simt_flash.cpp (whose
// opening comment says why). Label emu.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <ostream>
#include <string>
#include <vector>

#include "core/attention.h"
#include "attention/head_cpu.h"
#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "cuda/flash_launch.cuh"
#include "cuda/flash_plan.h"
#include "simt/simt.h"
#include "simt/simt_flash_test_util.h"
#include "simt/simt_test_util.h"

namespace st {
namespace {

using namespace simt_flash;

// ---------------------------------------------------------------- the sm_90 kernel

// The Hopper kernels (cuda/flash_fwd_sm90.cuh, flash_bwd_sm90.cuh: TMA, mbarriers, wgmma,
// warp specialisation, ping-pong named barriers; the forward, the dK/dV and dQ kernels and the
// dp_p delta pass) against the mma.sync kernels at the same tiles (128, 128): the emulator's wgmma sums
// each K = 16 step exactly as its mma.sync does, and the kernels call the same per-tile code,
// so every output must be the same bits (O, lse, the saved o32 / residual, the P~ == 1
// counts, delta, dQ/dK/dV). And O and the gradients against the CPU lab, as above. Shapes no
// other test uses: T = 1, T not a multiple of the tile, three key tiles (the producer reuses
// a stage after the consumers release it), causal and not, several batches and heads.
struct Sm90Case {
  DType fmt;
  int hs;
  bool stab, acc_low, scores_low;
  DeltaMode delta;
  bool causal;
  int T, B, NH;
  bool ptilde;
};
std::string sm90_name(const Sm90Case& c) {
  return case_name(Case{c.fmt, c.hs, 128, 128, c.stab, c.acc_low, c.scores_low, c.delta, c.causal,
                        c.T, c.B, c.NH, 0}) +
         (c.ptilde ? "_ptilde" : "");
}
void PrintTo(const Sm90Case& c, std::ostream* os) {
  *os << sm90_name(c);
}

class SimtFlashSm90 : public ::testing::TestWithParam<Sm90Case> {
 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend(1);
};

TEST_P(SimtFlashSm90, SameBitsAsMmaSyncKernelAndMatchesCpu) {
  const Sm90Case& cs = GetParam();
  const Dims d{cs.B, cs.T, cs.NH, cs.hs};
  const std::string name = "sm90_" + sm90_name(cs);
  SCOPED_TRACE(name);
  AttentionConfig cfg = config_of(Case{cs.fmt, cs.hs, 128, 128, cs.stab, cs.acc_low, cs.scores_low,
                                       cs.delta, cs.causal, cs.T, cs.B, cs.NH, 0});
  const Inputs in = random_inputs(d, cs.fmt, 7000 + static_cast<uint64_t>(cs.T * 3 + cs.hs), 2.0,
                                  cs.stab);
  const AttnNumerics n = cfg.numerics(cs.fmt, 0);
  auto forward = [&](FlashKernel k) {
    AttentionConfig c = cfg;
    c.cuda_kernel = k;
    return two_schedules([&] {
      const Buf qkv = dev(in.qkv, cs.fmt);
      const Buf out(cs.fmt, d.n_out()), lse(DType::F32, d.rows());
      Buf saved, ptilde;
      if (n.delta == DeltaMode::OFp32) saved = Buf(DType::F32, d.n_out());
      if (n.delta == DeltaMode::OSplit) saved = Buf(cs.fmt, d.n_out());
      if (cs.ptilde) ptilde = Buf(DType::I32, d.rows());
      emulated_forward(c, d, cs.fmt, qkv, out, lse, saved, ptilde);
      const Buf dout = dev(in.dout, cs.fmt);
      const Buf delta(DType::F32, d.rows()), dqkv(cs.fmt, d.n_qkv());
      emulated_backward(c, d, cs.fmt, qkv, dout, out, lse, saved, delta, dqkv);
      return std::vector<Buf>{out, lse, saved, ptilde, delta, dqkv};
    });
  };
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Buf> hop = forward(FlashKernel::Sm90);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<Buf> ref = forward(FlashKernel::MmaSync);
  ASSERT_EQ(hop.size(), 6u);
  ASSERT_EQ(ref.size(), 6u);
  const char* what[] = {"O", "lse", "saved", "p_tilde_one", "delta", "dQKV"};
  for (size_t i = 0; i < 6; ++i)
    EXPECT_TRUE(same_bytes(hop[i], ref[i])) << what[i] << ": the sm_90 kernel's bits differ";
  // Independently of the mma.sync kernels: O and the gradients against the CPU lab, with
  // ForwardBackwardMatchCpu's tolerances.
  const CpuOut cpu = run_cpu(*cpu_, cfg, in, cs.fmt, true);
  const Err eo = diff(values(hop[0]), values(cpu.out));
  std::printf("simt flash %s emulated (2 schedules) in %.2f s\n", name.c_str(), secs);
  expect_within(name, "O", eo, 4 * ulp_at(eo.max_ref, cs.fmt), cs.fmt);
  const char* parts[3] = {"dQ", "dK", "dV"};
  const size_t last = static_cast<size_t>(3 * d.C());
  for (int q = 0; q < 3; ++q) {
    const Err e = diff(values(hop[5], q, last), values(cpu.dqkv, q));
    expect_within(name, parts[q], e, (cs.acc_low ? 16 : 8) * ulp_at(e.max_ref, cs.fmt) + 1e-5,
                  cs.fmt);
  }
}

std::vector<Sm90Case> sm90_cases() {
  using D = DeltaMode;
  return {
      {DType::BF16, 64, false, false, false, D::O, true, 1, 1, 1, true},
      {DType::BF16, 64, true, false, true, D::OSplit, false, 200, 2, 1, true},
      {DType::BF16, 128, false, true, false, D::OFp32, true, 130, 1, 2, false},
      {DType::BF16, 128, true, true, true, D::DpP, true, 37, 1, 1, true},
      {DType::F16, 64, true, true, false, D::OFp32, false, 300, 1, 1, true},
      {DType::F16, 128, false, false, true, D::OSplit, false, 77, 1, 1, false},
  };
}
INSTANTIATE_TEST_SUITE_P(Kernels, SimtFlashSm90, ::testing::ValuesIn(sm90_cases()),
                         [](const ::testing::TestParamInfo<Sm90Case>& i) {
                           return sm90_name(i.param);
                         });

TEST(SimtFlashSm90Plan, RefusesOtherTiles) {
  const Dims d{1, 16, 1, 64};
  const Buf qkv = dev(std::vector<float>(d.n_qkv(), 0.5f), DType::BF16);
  const Buf out(DType::BF16, d.n_out()), lse(DType::F32, d.rows());
  AttentionConfig cfg;
  cfg.kind = AttentionKind::Flash;
  cfg.cuda_kernel = FlashKernel::Sm90;
  cfg.block_q = 128;
  cfg.block_k = 64;
  const uint64_t launches = simt::stats().launches;
  EXPECT_THROW(emulated_forward(cfg, d, DType::BF16, qkv, out, lse, Buf(), Buf()), Error);
  EXPECT_EQ(simt::stats().launches, launches) << "a refused call must not launch";
  EXPECT_EQ(parse_flash_kernel("sm90"), FlashKernel::Sm90);
  EXPECT_THROW(parse_flash_kernel("wgmma"), Error);
}

// ---------------------------------------------------------------- launcher checks

TEST(SimtFlashLaunchers, RejectUnsupportedShapesBeforeLaunching) {
  // What the launchers refuse (the class checks the same first): forward tiles outside
  // kFwdTilesText, head sizes other than 64 and 128, and the backward's low-precision
  // accumulator tiles that are not multiples of 64. Each throws before any launch.
  EXPECT_TRUE(flash::fwd_tiles_supported(64, 64));
  EXPECT_TRUE(flash::fwd_tiles_supported(128, 64));
  EXPECT_TRUE(flash::fwd_tiles_supported(128, 128));
  EXPECT_FALSE(flash::fwd_tiles_supported(64, 128));
  EXPECT_FALSE(flash::fwd_tiles_supported(32, 64));
  const uint64_t launches = simt::stats().launches;
  const Dims d{1, 16, 1, 64};
  const Buf qkv = dev(std::vector<float>(d.n_qkv(), 0.5f), DType::BF16);
  const Buf out(DType::BF16, d.n_out()), lse(DType::F32, d.rows()), delta(DType::F32, d.rows()),
      dqkv(DType::BF16, d.n_qkv());
  flash::FwdParams p;
  p.qkv = qkv.p();
  p.out = out.p();
  p.lse = lse.f();
  p.B = d.B, p.T = d.T, p.NH = d.NH, p.hs = d.hs;
  p.scale = flash::scale_of(d.hs);
  EXPECT_THROW(flash::fwd_bf16(p, 64, 128, false, false, nullptr), Error);
  EXPECT_THROW(flash::fwd_f16(p, 256, 64, true, false, nullptr), Error);
  p.hs = 32;
  EXPECT_THROW(flash::fwd_bf16(p, 64, 64, false, false, nullptr), Error);
  flash::BwdParams b;
  b.qkv = qkv.p();
  b.dout = out.p();
  b.lse = lse.f();
  b.delta = delta.f();
  b.dqkv = dqkv.p();
  b.B = d.B, b.T = d.T, b.NH = d.NH, b.hs = d.hs;
  b.scale = flash::scale_of(d.hs);
  b.block_q = 96;
  EXPECT_THROW(flash::bwd_bf16(b, true, nullptr), Error);
  EXPECT_THROW(flash::delta_dpp_f16(b, true, nullptr), Error);
  b.block_q = 64;
  b.hs = 32;
  EXPECT_THROW(flash::bwd_f16(b, false, nullptr), Error);
  EXPECT_EQ(simt::stats().launches, launches) << "a refused call must not launch";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace st
