// CUDA flash / stabilized-flash attention (cuda/flash_*.cu, issue 9) against the CPU lab
// (attention/head_cpu.cpp through the CPU Attention class) and an FP64 reference, and
// cuDNN's fused attention (attention.backend cudnn, cuda/attention_cudnn.cu, issue 25)
// against the FP64 reference and our flash (the GpuCudnn tests, in test_gpu_cudnn.cpp; the
// fixture and checks both use in test_gpu_flash.h). Label gpu:
// every test FAILS, never skips, without a GPU.
//
// Tolerances. The GPU kernels round at the CPU lab's points (same formats, same tiles); what
// differs is FP32 arithmetic below those points: the tensor cores' summation order (and
// their internal alignment) instead of the CPU's sequential FMA chains, ex2.approx/logf
// instead of FP64 exp/log, and FP32 instead of FP64 for S - m. Those differences are a few
// FP32 ulps; they matter only where a value sits next to a rounding boundary of the low
// format, which then flips by one low-format ulp (P~, dS, the stored O and gradients, and in
// accum = low mode the accumulators). So parity is judged in low-format ulps of the output
// tensor's largest magnitude: O within 4 ulps, gradients within 8 (they sum many rounded
// dS, P terms), 16 in the accum = low mode (each tile's accumulator rounding can flip);
// lse (FP32) within 5e-5 (1 + max|lse|). Every figure is printed on a line starting with
// "parity flash" (tools/gpu_check.sh collects them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention_cpu.h"
#include "attention/head_cpu.h"
#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda/attention_cuda.h"
#include "cuda/flash_attention.h"
#include "flash_amp_cases.h"
#include "test_gpu_flash.h"

namespace st {
namespace {

using namespace gpu_flash;

TEST_F(GpuFlash, ParityWithCpuLab) {
  struct Case {
    Dims d;
    bool causal;
    int bq, bk;
  };
  const std::vector<Case> cases = {
      {{1, 1, 2, 64}, true, 64, 64},     {{1, 63, 2, 64}, true, 64, 64},
      {{2, 64, 2, 64}, false, 64, 64},   {{1, 65, 3, 64}, true, 64, 64},
      {{2, 200, 3, 64}, false, 64, 64},  {{4, 200, 8, 64}, true, 64, 64},   // B*NH = 32
      {{2, 200, 3, 64}, true, 128, 64},  {{2, 200, 3, 64}, false, 128, 128},
      {{1, 1000, 2, 64}, true, 64, 64},  {{1, 1000, 2, 64}, true, 128, 128},
      {{1, 1, 2, 128}, false, 64, 64},   {{2, 65, 2, 128}, true, 64, 64},
      {{1, 200, 2, 128}, false, 64, 64}, {{1, 200, 2, 128}, true, 128, 64},
      {{1, 1000, 1, 128}, true, 128, 64}, {{1, 1000, 2, 128}, false, 64, 64},
  };
  uint64_t seed = 100;
  for (DType fmt : {DType::BF16, DType::F16})
    for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
      for (const Case& cs : cases) {
        if (fmt == DType::F16 && cs.d.T == 1000 && cs.d.hs == 64 && cs.bq == 64) continue;  // time
        const AttentionConfig cfg = flash_cfg(kind, cs.causal, cs.bq, cs.bk);
        const Inputs in = random_inputs(cs.d, fmt, ++seed);
        const std::string name = case_name(cfg, cs.d, fmt);
        SCOPED_TRACE(name);
        const Outputs g = run_gpu(cfg, in, fmt), c = run_cpu(cfg, in, fmt);
        expect_parity(name, g, c, fmt, 8);
      }
}

TEST_F(GpuFlash, ParityPrecisionKnobs) {
  // scores rounded to the compute format after scaling; accum = compute format (the paper's
  // low-precision O~ accumulator, and the backward's per-tile rounded accumulators).
  struct Knob {
    bool scores_low, accum_low;
  };
  const Dims shapes[] = {{2, 200, 3, 64}, {1, 130, 2, 128}};
  uint64_t seed = 300;
  for (DType fmt : {DType::BF16, DType::F16})
    for (const Knob& k : {Knob{true, false}, Knob{false, true}, Knob{true, true}})
      for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
        for (const Dims& d : shapes)
          for (int bq : {64, 128}) {
            AttentionConfig cfg = flash_cfg(kind, (seed & 1) != 0, bq, 64);
            if (k.scores_low) cfg.scores = fmt;
            if (k.accum_low) cfg.accum = fmt;
            const Inputs in = random_inputs(d, fmt, ++seed);
            const std::string name = case_name(cfg, d, fmt);
            SCOPED_TRACE(name);
            const Outputs g = run_gpu(cfg, in, fmt), c = run_cpu(cfg, in, fmt);
            expect_parity(name, g, c, fmt, k.accum_low ? 16 : 8, k.scores_low);
          }
}

TEST_F(GpuFlash, AgainstFp64Reference) {
  // flash-attention's rule (RESEARCH.md section 3): the kernel's error against FP64 at most
  // twice the error of a straightforward implementation at the same precision, here the CPU
  // backend's baseline attention (S and P materialised in the compute format).
  const Dims shapes[] = {{2, 200, 4, 64}, {1, 1000, 2, 64}, {2, 257, 2, 128}};
  uint64_t seed = 500;
  for (DType fmt : {DType::BF16, DType::F16})
    for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
      for (const Dims& d : shapes) {
        const AttentionConfig cfg = flash_cfg(kind, true);
        AttentionConfig base = cfg;
        base.kind = AttentionKind::Baseline;
        const Inputs in = random_inputs(d, fmt, ++seed);
        const std::string name = case_name(cfg, d, fmt);
        SCOPED_TRACE(name);
        const Outputs g = run_gpu(cfg, in, fmt), b = run_cpu(base, in, fmt), r = run_f64(true, in);
        const char* names[4] = {"O", "dQ", "dK", "dV"};
        for (int p = -1; p < 3; ++p) {
          const std::vector<double> ref = p < 0 ? values(r.out) : values(r.dqkv, p);
          const Err eg = compare(p < 0 ? values(g.out) : values(g.dqkv, p), ref);
          const Err eb = compare(p < 0 ? values(b.out) : values(b.dqkv, p), ref);
          std::printf("parity flash fp64 %s %s gpu_err=%.3e cpu_baseline_err=%.3e ratio=%.3f\n",
                      name.c_str(), names[p + 1], eg.max_abs, eb.max_abs,
                      eb.max_abs > 0 ? eg.max_abs / eb.max_abs : 0.0);
          EXPECT_FALSE(eg.nonfinite) << names[p + 1];
          EXPECT_LE(eg.max_abs, 2 * eb.max_abs) << names[p + 1];
        }
      }
}

// ---- Qiu & Yao tied maxima (the construction of attention/experiments.cpp at head size 64):
// in each (b, h), query row r < 32 has q = e_{2r} + e_{2r+1}; key s has k[2r] = hi,
// k[2r+1] = lo, the bf16 pair of X = 8 S_r(s), so scale * q.k = (hi + lo) / 8 exactly in FP32
// (scale = 1/8) and tied keys, having identical (hi, lo), have identical scores in every
// format. S_r(s) = top for two keys inside one random key tile, top - U(12, 20) for the rest.
// V ~ N(v_mean, v_std) in bf16, per (b, h). Rows >= 32 have q = 0 and are not counted.
Inputs tied_inputs(int B, int NH, int T, int bc, double top, double v_mean, double v_std,
                   uint64_t seed) {
  const Dims d{B, T, NH, 64};
  const int C = d.C();
  Inputs in{d, Tensor::zeros({B, T, 3 * C}, DType::F32), Tensor::empty({B, T, C}, DType::F32)};
  float* a = in.qkv.data<float>();
  Rng rng(seed);
  auto at = [&](int b, int t, int which, int h, int j) -> float& {
    return a[(static_cast<size_t>(b) * T + t) * 3 * C + which * C + h * 64 + j];
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      for (int r = 0; r < 32; ++r) {
        const int tiles = (T + bc - 1) / bc;
        int c0, w;
        do {
          c0 = static_cast<int>(rng.below(tiles)) * bc;
          w = std::min(bc, T - c0);
        } while (w < 2);
        const int p0 = c0 + static_cast<int>(rng.below(w));
        int p1;
        do p1 = c0 + static_cast<int>(rng.below(w));
        while (p1 == p0);
        at(b, r, 0, h, 2 * r) = 1.0f;
        at(b, r, 0, h, 2 * r + 1) = 1.0f;
        for (int s = 0; s < T; ++s) {
          const double S = (s == p0 || s == p1) ? top : top - (12 + 8 * rng.uniform());
          const double X = 8 * S;
          const double hi = round_fmt(X, DType::BF16);
          at(b, s, 1, h, 2 * r) = static_cast<float>(hi);
          at(b, s, 1, h, 2 * r + 1) = static_cast<float>(round_fmt(X - hi, DType::BF16));
        }
      }
      for (int s = 0; s < T; ++s)
        for (int j = 0; j < 64; ++j)
          at(b, s, 2, h, j) = static_cast<float>(round_fmt(v_mean + v_std * rng.normal(), DType::BF16));
    }
  float* g = in.dout.data<float>();
  for (int64_t i = 0; i < in.dout.numel(); ++i) g[i] = round_bf16(static_cast<float>(rng.normal()));
  return in;
}

// Per counted row: mean over head dims of (O - O_ref).
std::vector<double> row_errors(const Dims& d, const Tensor& o, const Tensor& ref) {
  std::vector<double> e;
  const std::vector<double> a = values(o), r = values(ref);
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h)
      for (int t = 0; t < 32; ++t) {
        double s = 0;
        for (int j = 0; j < 64; ++j) {
          const size_t i = (static_cast<size_t>(b) * d.T + t) * d.C() + h * 64 + j;
          s += a[i] - r[i];
        }
        e.push_back(s / 64);
      }
  return e;
}
struct MeanSe {
  double mean = 0, se = 0;
  bool finite = true;
};
MeanSe mean_se(const std::vector<double>& x) {
  MeanSe m;
  double s = 0, ss = 0;
  for (double v : x) {
    if (!std::isfinite(v)) m.finite = false;
    s += v;
  }
  m.mean = s / x.size();
  for (double v : x) ss += (v - m.mean) * (v - m.mean);
  m.se = std::sqrt(ss / (x.size() - 1) / x.size());
  return m;
}

// The O~ amplifier kernels (cuda/flash_fwd_amp_*.cu; attention.o_tilde_bits, o_tilde_gain,
// o_tilde_scope all | tied) against the CPU lab, the cases of tests/flash_amp_cases.h (the
// emulator runs the same: tests/simt/test_simt_flash_amp.cpp): O, the FP32 O (delta o_fp32's
// saved tensor) and lse bit for bit on the exact inputs (accum = the compute format; why they
// are exact on a GPU too, ex2.approx included, is in the header), within 4 / 4.5 ulps and
// 5e-5 (1 + max|lse|) on the random ones (accum fp32).
TEST_F(GpuFlash, AmplifierMatchesTheLab) {
  amp_test::check_exp_margins();
  for (const amp_test::Case& c : amp_test::kCases) {
    SCOPED_TRACE(c.name);
    const amp_test::Dims d{c.B, c.T, c.NH, c.hs};
    const std::vector<float> qkv = c.exact ? amp_test::exact_inputs(d, c.fmt, c.bk, c.seed)
                                           : amp_test::random_inputs(d, c.fmt, c.seed);
    const AttentionConfig cfg = amp_test::config_of(c);
    const amp_test::Lab lab = amp_test::run_lab(cfg, d, c.fmt, qkv);
    amp_test::check_premises("gpu flash amp", c, qkv, lab);
    Tensor host = Tensor::empty({d.B, d.T, 3 * d.C()}, DType::F32);
    std::copy(qkv.begin(), qkv.end(), host.data<float>());
    auto attn = gpu_->make_attention(cfg);
    const Tensor x = to_gpu(host, c.fmt);
    const Tensor out = poisoned({d.B, d.T, d.C()}, c.fmt), lse = poisoned({d.B, d.NH, d.T}, DType::F32);
    attn->forward(out, lse, x, d.NH, c.fmt);
    gpu_->synchronize();
    const std::vector<float> saved = flash_cuda_saved_o(*attn);
    const char* who = "gpu flash amp";
    amp_test::compare(who, c, "O", values(to_host(out)), lab.o, c.fmt, 4);
    amp_test::compare(who, c, "o32", std::vector<double>(saved.begin(), saved.end()), lab.o32, c.fmt, 4.5);
    double max_lse = 0;
    for (double v : lab.lse) max_lse = std::max(max_lse, std::fabs(v));
    amp_test::compare(who, c, "lse", values(to_host(lse)), lab.lse, DType::F32,
                      5e-5 * (1 + max_lse) / amp_test::ulp_at(max_lse, DType::F32));
  }
}

TEST_F(GpuFlash, TiedMaximaBias) {
  // BF16 O~ accumulator (accum = bf16), V ~ N(-1.5, 0.2), two tied maxima at +5 in one key
  // tile, 2048 rows. The CPU tests' thresholds (tests/test_attn_deviation.cpp): flash more
  // than 10 SE from 0 along sign(V); stabilized (beta 2) within 0.1 |flash| and within 3 SE
  // of 0 (the CPU test uses 2 SE on its own seed; one more SE of room for a fixed seed we
  // could not try on a GPU beforehand; the CPU lab itself gives -1.94e-3 (z -354) for flash
  // and +1.4e-5 (z 1.5) for beta 2 on these rows). beta 7 is only compared with the CPU lab:
  // on these rows the lab itself keeps a real residual (+1.8e-4, z 18; the tied P~ are
  // exp(-30) there). Each GPU series matches the CPU lab's on the same rows: the per-row
  // difference GPU - CPU averages within 3 SE (of that difference) + 2% of flash's bias.
  const int B = 8, NH = 8, T = 512;
  for (double top : {5.0, 20.0}) {  // 20 with beta 7: the underflow cap must keep O finite
    const Inputs in = tied_inputs(B, NH, T, 64, top, -1.5, 0.2, 77);
    const Outputs ref = run_f64(false, in);
    MeanSe flash_gpu;
    for (double beta : {0.0, 2.0, 7.0}) {  // 0: flash
      AttentionConfig cfg = flash_cfg(beta == 0 ? AttentionKind::Flash : AttentionKind::StabilizedFlash, false);
      if (beta > 0) cfg.beta = beta;
      cfg.accum = DType::BF16;
      const Outputs g = run_gpu(cfg, in, DType::BF16, false);
      const Outputs c = run_cpu(cfg, in, DType::BF16, false);
      const std::vector<double> eg = row_errors(in.d, g.out, ref.out), ec = row_errors(in.d, c.out, ref.out);
      std::vector<double> diff(eg.size());
      for (size_t i = 0; i < eg.size(); ++i) diff[i] = eg[i] - ec[i];
      const MeanSe mg = mean_se(eg), mc = mean_se(ec), md = mean_se(diff);
      std::printf("parity flash tied top=%g beta=%g rows=%zu gpu_mean=%+.3e se=%.1e cpu_mean=%+.3e se=%.1e diff=%+.3e se=%.1e\n",
                  top, beta, eg.size(), mg.mean, mg.se, mc.mean, mc.se, md.mean, md.se);
      EXPECT_TRUE(mg.finite) << "beta " << beta;
      if (beta == 0) {
        flash_gpu = mg;
        if (top == 5.0) {
          EXPECT_GT(std::fabs(mg.mean), 10 * mg.se);
          EXPECT_TRUE(std::signbit(mg.mean)) << "bias along sign(V) < 0";
        }
      } else if (top == 5.0 && beta == 2.0) {
        EXPECT_LT(std::fabs(mg.mean), 0.1 * std::fabs(flash_gpu.mean)) << "beta " << beta;
        EXPECT_LT(std::fabs(mg.mean), 3 * mg.se) << "beta " << beta;
      }
      EXPECT_LE(std::fabs(md.mean), 3 * md.se + 0.02 * std::fabs(flash_gpu.mean) + 1e-7)
          << "GPU vs CPU lab, beta " << beta;
    }
  }
}

// ---- delta modes

TEST_F(GpuFlash, DeltaModesMatchCpu) {
  // The GPU's delta (flash_cuda_last_delta) against the CPU's head_deltas fed the GPU's own
  // forward results (O, lse, and the saved o32 / residual), so the comparison isolates the
  // delta computation: o, o_split and o_fp32 run the CPU's sequential FMA chain and must
  // be bit-identical (o_split: both take hi = the stored O and lo = the saved residual; the
  // CPU re-derives lo = round(o32 - O) from o32 = O + lo, which is lo exactly); dp_p
  // recomputes P and dP with MMAs, so within 1e-3 of the row's scale.
  const Dims shapes[] = {{2, 130, 2, 64}, {1, 77, 2, 128}};
  uint64_t seed = 700;
  for (const Dims& d : shapes)
    for (bool acc_low : {false, true})
      for (DeltaMode mode : {DeltaMode::O, DeltaMode::OSplit, DeltaMode::OFp32, DeltaMode::DpP}) {
        AttentionConfig cfg = flash_cfg(AttentionKind::Flash, true);
        cfg.delta = mode;
        if (acc_low) cfg.accum = DType::BF16;
        const Inputs in = random_inputs(d, DType::BF16, ++seed);
        const Outputs g = run_gpu(cfg, in, DType::BF16);
        ASSERT_EQ(g.delta.size(), static_cast<size_t>(d.B) * d.NH * d.T);
        const AttnNumerics n = cfg.numerics(DType::BF16, 0);
        int64_t exact = 0, total = 0;
        double max_err = 0, max_ref = 0;
        for (int b = 0; b < d.B; ++b)
          for (int h = 0; h < d.NH; ++h) {
            std::vector<double> q(d.T * d.hs), k(q.size()), v(q.size()), dO(q.size());
            HeadForward fw;
            fw.o.resize(q.size());
            fw.o32.resize(q.size());
            fw.lse.resize(d.T);
            for (int t = 0; t < d.T; ++t) {
              fw.lse[t] = g.lse.data<float>()[(static_cast<size_t>(b) * d.NH + h) * d.T + t];
              for (int j = 0; j < d.hs; ++j) {
                const size_t r3 = (static_cast<size_t>(b) * d.T + t) * 3 * d.C() + h * d.hs + j;
                const size_t r1 = (static_cast<size_t>(b) * d.T + t) * d.C() + h * d.hs + j;
                const size_t i = static_cast<size_t>(t) * d.hs + j;
                q[i] = in.qkv.data<float>()[r3];
                k[i] = in.qkv.data<float>()[r3 + d.C()];
                v[i] = in.qkv.data<float>()[r3 + 2 * d.C()];
                dO[i] = in.dout.data<float>()[r1];
                fw.o[i] = g.out.data<float>()[r1];
                if (mode == DeltaMode::OFp32) fw.o32[i] = g.saved[r1];
                if (mode == DeltaMode::OSplit) fw.o32[i] = fw.o[i] + g.saved[r1];
              }
            }
            const std::vector<double> cd = head_deltas(cfg, n, d.T, d.hs, q.data(), k.data(),
                                                       v.data(), fw, dO.data());
            for (int t = 0; t < d.T; ++t) {
              const double gd = g.delta[(static_cast<size_t>(b) * d.NH + h) * d.T + t];
              exact += gd == cd[t];
              ++total;
              max_err = std::max(max_err, std::fabs(gd - cd[t]));
              max_ref = std::max(max_ref, std::fabs(cd[t]));
            }
          }
        std::printf("parity flash delta mode=%s accum=%s hs=%d T=%d exact=%lld/%lld max_abs=%.3e max_ref=%.3e\n",
                    delta_mode_name(mode), acc_low ? "bf16" : "fp32", d.hs, d.T,
                    static_cast<long long>(exact), static_cast<long long>(total), max_err, max_ref);
        SCOPED_TRACE(delta_mode_name(mode));
        if (mode != DeltaMode::DpP) {
          EXPECT_EQ(exact, total);
        } else {
          EXPECT_LE(max_err, (acc_low ? 2e-2 : 1e-3) * max_ref + 1e-6);
        }
        // And the whole backward of each mode against the CPU lab's.
        const Outputs c = run_cpu(cfg, in, DType::BF16);
        expect_parity(std::string("delta=") + delta_mode_name(mode) + " " + case_name(cfg, d, DType::BF16),
                      g, c, DType::BF16, acc_low ? 16 : 8);
      }
}

// ---- determinism

TEST_F(GpuFlash, Deterministic) {
  const Dims d{2, 300, 4, 64};
  const Inputs in = random_inputs(d, DType::BF16, 901);
  for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
    for (DeltaMode mode : {DeltaMode::O, DeltaMode::DpP})
      for (bool acc_low : {false, true}) {
        AttentionConfig cfg = flash_cfg(kind, true, 128, 64);
        cfg.delta = mode;
        if (acc_low) cfg.accum = DType::BF16;
        const Outputs a = run_gpu(cfg, in, DType::BF16), b = run_gpu(cfg, in, DType::BF16);
        for (const auto& [x, y, what] : {std::tuple{&a.out, &b.out, "out"}, std::tuple{&a.lse, &b.lse, "lse"},
                                          std::tuple{&a.dqkv, &b.dqkv, "dqkv"}})
          EXPECT_EQ(std::memcmp(x->raw(), y->raw(), x->nbytes()), 0)
              << what << " differs between two runs (" << kind_str(kind) << ", delta "
              << delta_mode_name(mode) << ", accum " << (acc_low ? "bf16" : "fp32") << ")";
      }
}

// ---- the sm_90 forward kernel (attention.cuda_kernel: sm90; Hopper only)

// The Hopper kernels (TMA, wgmma, warp specialisation: the forward and the backward) against
// the CPU lab with the mma.sync kernels' tolerances, run-to-run bit-identity, and the figure of how far it lies from the mma.sync kernel
// at the same tiles (on the emulator they are bit-identical; on a GPU the tensor cores'
// summation inside a K = 16 step may differ between mma.sync and wgmma: printed, not
// asserted beyond the CPU tolerances). Fails on a GPU that is not compute capability 9.0.
TEST_F(GpuFlash, Sm90KernelParity) {
  struct Case {
    Dims d;
    bool causal;
  };
  const std::vector<Case> cases = {
      {{1, 1, 2, 64}, true},    {{2, 200, 3, 64}, false}, {{1, 1000, 2, 64}, true},
      {{1, 77, 2, 128}, true},  {{2, 300, 2, 128}, false}, {{1, 1000, 1, 128}, true},
  };
  uint64_t seed = 700;
  for (DType fmt : {DType::BF16, DType::F16})
    for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
      for (bool acc_low : {false, true})
        for (const Case& cs : cases) {
          if (fmt == DType::F16 && cs.d.T == 1000) continue;  // time (one case per 120 s)
          AttentionConfig cfg = flash_cfg(kind, cs.causal, 128, 128);
          if (acc_low) cfg.accum = fmt;
          if (cs.d.T == 77 || cs.d.T == 200) cfg.delta = DeltaMode::DpP;  // the sm_90 delta pass
          const Inputs in = random_inputs(cs.d, fmt, ++seed);
          AttentionConfig hop = cfg;
          hop.cuda_kernel = FlashKernel::Sm90;
          const std::string name = "sm90_" + case_name(cfg, cs.d, fmt) + (acc_low ? "_acclow" : "");
          SCOPED_TRACE(name);
          const Outputs g = run_gpu(hop, in, fmt), g2 = run_gpu(hop, in, fmt);
          const Outputs m = run_gpu(cfg, in, fmt, false), c = run_cpu(cfg, in, fmt);
          expect_parity(name, g, c, fmt, acc_low ? 16 : 8);
          EXPECT_EQ(std::memcmp(g.out.raw(), g2.out.raw(), g.out.nbytes()), 0) << "O run to run";
          EXPECT_EQ(std::memcmp(g.dqkv.raw(), g2.dqkv.raw(), g.dqkv.nbytes()), 0) << "dqkv run to run";
          const Err e = compare(values(g.out), values(m.out));
          std::printf("sm90 vs mma_sync %s O max_abs=%.3e identical=%s\n", name.c_str(), e.max_abs,
                      std::memcmp(g.out.raw(), m.out.raw(), g.out.nbytes()) == 0 ? "yes" : "no");
        }
}

TEST_F(GpuFlash, StatsMatchCpu) {
  // stats() per head: rows, tied_rows, tied_in_tile, p_one, p_tilde_one and max_logit equal
  // to the CPU's (the scores are exact here, and the GPU's row-statistics kernel forms S as
  // the CPU does; p_tilde_one is the forward kernel's P~ == 1, p_one the host's test of
  // exp(max_logit - lse) against the CPU's per-entry count of P from lse);
  // the entropy to 1e-9 relative (FP64, different order). Random inputs too: counts equal
  // (no score sits within FP32 rounding of a tie threshold there), max_logit to 1e-6.
  struct Run {
    Inputs in;
    bool exact;
  };
  std::vector<Run> runs;
  runs.push_back({stats_inputs(2, 3, 300, 11), true});
  runs.push_back({random_inputs({2, 200, 2, 64}, DType::BF16, 12, 3.0), false});
  for (const Run& run : runs)
    for (AttentionKind kind : {AttentionKind::Flash, AttentionKind::StabilizedFlash})
      for (bool causal : {true, false}) {
        AttentionConfig cfg = flash_cfg(kind, causal);
        cfg.collect_stats = true;
        const Outputs g = run_gpu(cfg, run.in, DType::BF16, false);
        const Outputs c = run_cpu(cfg, run.in, DType::BF16, false);
        ASSERT_EQ(g.stats.size(), static_cast<size_t>(run.in.d.NH));
        ASSERT_EQ(c.stats.size(), g.stats.size());
        for (size_t h = 0; h < g.stats.size(); ++h) {
          const AttentionHeadStats &a = g.stats[h], &b = c.stats[h];
          attn_test::print_head_stats(std::string("parity flash stats ") +
                                          (run.exact ? "exact" : "random") + " " + kind_str(kind) +
                                          " " + (causal ? "causal" : "noncausal"),
                                      h, a, b, "gpu/cpu");
          attn_test::expect_same_head_stats(a, b, run.exact);
          if (run.exact) {
            EXPECT_GT(b.tied_in_tile, 0) << "the construction should tie inside tiles";
          }
        }
      }
  // Off unless asked for.
  const Outputs g = run_gpu(flash_cfg(AttentionKind::Flash, true), runs[0].in, DType::BF16, false);
  EXPECT_TRUE(g.stats.empty());
}

// ---- errors

TEST_F(GpuFlash, UnsupportedSettingsFail) {
  // Each unsupported knob: one line naming the attention.* key (at make_attention, or at the
  // first forward once the compute format is known).
  const Dims d{1, 16, 2, 64};
  const Inputs in = random_inputs(d, DType::BF16, 3);
  const std::vector<Bad> bad = {
      {"attention.block_q", [](AttentionConfig& c) { c.block_q = 0; }},
      {"attention.block_k", [](AttentionConfig& c) { c.block_k = 32; }},
      {"attention.block_q", [](AttentionConfig& c) { c.block_q = 256; }},
      {"attention.rule", [](AttentionConfig& c) { c.rule = RoundingRule::EveryOp; }},
      {"attention.rule", [](AttentionConfig& c) { c.rule = RoundingRule::EveryMac; }},
      {"attention.fp32_out_heads", [](AttentionConfig& c) { c.fp32_out_heads = {1}; }},
      {"attention.delta", [](AttentionConfig& c) { c.delta = DeltaMode::Fp32Recompute; }},
      {"attention.mac", [](AttentionConfig& c) { c.mac = DType::BF16; }},
      {"attention.scores", [](AttentionConfig& c) { c.scores = DType::F16; }},
      {"attention.accum", [](AttentionConfig& c) { c.accum = DType::F16; }},
      {"attention.probs", [](AttentionConfig& c) { c.probs = DType::F32; }},
      {"attention.out", [](AttentionConfig& c) { c.out = DType::F32; }},
      {"attention.qkv", [](AttentionConfig& c) { c.qkv = DType::F32; }},
      {"attention.grads", [](AttentionConfig& c) { c.grads = DType::F32; }},
      {"attention.backend", [](AttentionConfig&) {}, DType::F32},  // fp32 compute: use baseline
      {"attention.o_tilde_scope",
       [](AttentionConfig& c) {
         c.accum = DType::BF16;
         c.o_tilde_gain = 64;
         c.o_tilde_scope = OTildeScope::UntiedMatched;
       }},
      {"attention.tie_break", [](AttentionConfig& c) { c.tie_break = 0x1p-8; }},
      {"attention.cuda_kernel",
       [](AttentionConfig& c) {
         c.block_q = c.block_k = 128;
         c.accum = DType::BF16;
         c.o_tilde_gain = 64;
         c.cuda_kernel = FlashKernel::Sm90;
       }},
  };
  expect_refused("", flash_cfg(AttentionKind::StabilizedFlash, true), bad, in);
  // fp32_out_heads points to the delta mode that replaces it.
  AttentionConfig cfg = flash_cfg(AttentionKind::Flash, true);
  cfg.fp32_out_heads = {0};
  std::string msg;
  try {
    gpu_->make_attention(cfg);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("o_fp32"), std::string::npos) << msg;
  // Head size 32 is not supported.
  const Dims d32{1, 16, 2, 32};
  const Inputs in32 = random_inputs(d32, DType::BF16, 4);
  msg.clear();
  try {
    auto attn = gpu_->make_attention(flash_cfg(AttentionKind::Flash, true));
    const Tensor qkv = to_gpu(in32.qkv, DType::BF16);
    const Tensor out = gpu_->alloc({1, 16, 64}, DType::BF16), lse = gpu_->alloc({1, 2, 16}, DType::F32);
    attn->forward(out, lse, qkv, 2, DType::BF16);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("head size"), std::string::npos) << msg;
}

}  // namespace
}  // namespace st
