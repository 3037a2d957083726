// cuDNN's fused attention (attention.backend cudnn, cuda/attention_cudnn.cu, issue 25) on the
// GPU against the FP64 reference and our flash kernels; part of test_gpu_flash (the fixture
// and the checks are test_gpu_flash.h's). Label gpu: every test FAILS, never skips, without a
// GPU.
//
// cuDNN rounds at its own points (P to the compute format before P V, O once at the store,
// dS to the compute format before dK and dQ; FP32 everywhere else, by the graph it is given;
// NVIDIA does not document more), so nothing here is a bit comparison. The bars:
//   - against FP64: flash-attention's rule, as for our flash (AgainstFp64Reference): O, dQ,
//     dK, dV each within twice the error of the CPU's straightforward BF16/FP16 attention
//     (S and P materialised in the format) on the same inputs;
//   - lse: S is an FP32 product of exact inputs, so the natural-log lse is FP32-close to
//     FP64's: within 1e-4 (1 + |lse|) (it would be off by O(1) with a wrong scale, a log2
//     lse or a missing mask);
//   - against our flash (both FP32 inside, rounding P and O to the format): the difference of
//     two results each within u max|V| (P's rounding, u = 2^-8 bf16, 2^-11 fp16) plus half
//     an ulp of max|O| (O's) of the exact O: 2 (u max|V| + ulp(max|O|)) for O. Gradients:
//     within 16 format ulps of the largest |gradient| (the bar our accum-low flash meets
//     against the CPU lab, whose roundings also differ per tile).
// Every figure is printed on a "parity cudnn" line (tools/gpu_check.sh collects them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "cuda/attention_cuda.h"
#include "test_gpu_flash.h"

namespace st {
namespace {

using namespace gpu_flash;

class GpuCudnn : public GpuFlash {};

AttentionConfig cudnn_cfg(bool causal) {
  AttentionConfig c;
  c.kind = AttentionKind::Cudnn;
  c.causal = causal;
  return c;
}

TEST_F(GpuCudnn, AgainstFp64AndOurFlash) {
  struct Case {
    Dims d;
    bool causal;
  };
  // Head sizes 64 and 128, T not a multiple of 64 (and one that is), causal and not.
  const std::vector<Case> cases = {{{2, 200, 4, 64}, true},  {{1, 257, 2, 128}, true},
                                   {{2, 1000, 2, 64}, true}, {{1, 130, 2, 128}, false},
                                   {{1, 128, 3, 64}, true}};
  uint64_t seed = 2500;
  for (DType fmt : {DType::BF16, DType::F16})
    for (const Case& cs : cases) {
      const Dims& d = cs.d;
      const Inputs in = random_inputs(d, fmt, ++seed);
      AttentionConfig base = cudnn_cfg(cs.causal);
      base.kind = AttentionKind::Baseline;
      const Outputs c = run_gpu(cudnn_cfg(cs.causal), in, fmt);
      const Outputs f = run_gpu(flash_cfg(AttentionKind::Flash, cs.causal), in, fmt);
      const Outputs b = run_cpu(base, in, fmt);
      const Outputs r = run_f64(cs.causal, in);
      char name[160];
      std::snprintf(name, sizeof name, "%s hs=%d T=%d B=%d NH=%d %s", dtype_name(fmt), d.hs, d.T,
                    d.B, d.NH, cs.causal ? "causal" : "noncausal");
      SCOPED_TRACE(name);
      std::printf("parity cudnn %s engine: %s\n", name, c.engine.c_str());
      // lse against FP64.
      const std::vector<double> lc = values(c.lse), lr = values(r.lse);
      double lse_worst = 0;
      for (size_t i = 0; i < lc.size(); ++i) {
        const double e = std::fabs(lc[i] - lr[i]) / (1 + std::fabs(lr[i]));
        lse_worst = std::isfinite(e) ? std::max(lse_worst, e) : INFINITY;
      }
      std::printf("parity cudnn %s lse max_rel_err=%.3e (bar 1e-4)\n", name, lse_worst);
      EXPECT_LE(lse_worst, 1e-4) << "lse";
      const double u = std::ldexp(1.0, fmt == DType::BF16 ? -8 : -11);
      double max_v = 0;
      for (double v : values(in.qkv, 2)) max_v = std::max(max_v, std::fabs(v));
      const char* names[4] = {"O", "dQ", "dK", "dV"};
      for (int p = -1; p < 3; ++p) {
        auto pick = [&](const Outputs& o) { return p < 0 ? values(o.out) : values(o.dqkv, p); };
        const std::vector<double> ref = pick(r);
        const Err ec = compare(pick(c), ref), eb = compare(pick(b), ref), ef = compare(pick(f), ref);
        const Err cf = compare(pick(c), pick(f));
        const double bar_flash = p < 0 ? 2 * (u * max_v + ulp_at(ec.max_ref, fmt))
                                       : 16 * ulp_at(ec.max_ref, fmt);
        std::printf("parity cudnn %s %s cudnn_err=%.3e flash_err=%.3e cpu_baseline_err=%.3e "
                    "ratio=%.3f (bar 2) cudnn_vs_flash=%.3e (bar %.3e)%s\n",
                    name, names[p + 1], ec.max_abs, ef.max_abs, eb.max_abs,
                    eb.max_abs > 0 ? ec.max_abs / eb.max_abs : 0.0, cf.max_abs, bar_flash,
                    ec.nonfinite ? " NONFINITE" : "");
        EXPECT_FALSE(ec.nonfinite) << names[p + 1];
        EXPECT_LE(ec.max_abs, 2 * eb.max_abs) << names[p + 1] << " against FP64";
        EXPECT_LE(cf.max_abs, bar_flash) << names[p + 1] << " against our flash";
      }
    }
}

TEST_F(GpuCudnn, RunToRunBitIdenticalAndTheEngineSaysWhy) {
  // Two fresh Attention objects (the plan is cached and reused) on the same inputs: out, lse
  // and dqkv bit for bit. The engine's numerical notes are printed: a non-deterministic
  // backward engine is the one thing that may make this fail, and the line says so.
  const Dims d{2, 300, 4, 64};
  for (DType fmt : {DType::BF16, DType::F16}) {
    const Inputs in = random_inputs(d, fmt, 2601);
    const Outputs a = run_gpu(cudnn_cfg(true), in, fmt), b = run_gpu(cudnn_cfg(true), in, fmt);
    std::printf("parity cudnn determinism %s: %s\n", dtype_name(fmt), a.engine.c_str());
    for (const auto& [x, y, what] : {std::tuple{&a.out, &b.out, "out"}, std::tuple{&a.lse, &b.lse, "lse"},
                                      std::tuple{&a.dqkv, &b.dqkv, "dqkv"}})
      EXPECT_EQ(std::memcmp(x->raw(), y->raw(), x->nbytes()), 0)
          << what << " differs between two runs (" << dtype_name(fmt) << "; backward engine "
          << (a.nondeterministic ? "marked NON-deterministic" : "marked deterministic") << ")";
    EXPECT_FALSE(a.nondeterministic) << "cuDNN chose a backward engine it marks non-deterministic";
  }
}

TEST_F(GpuCudnn, StatsFromOurRowKernelAndCudnnsLse) {
  // collect_stats: the same per-row statistics as our flash (the row kernel reads the
  // scores), p_one from cuDNN's lse; p_tilde_one is not measured (-1).
  const Inputs in = stats_inputs(2, 3, 300, 21);
  AttentionConfig cc = cudnn_cfg(true), fc = flash_cfg(AttentionKind::Flash, true);
  cc.collect_stats = fc.collect_stats = true;
  const Outputs c = run_gpu(cc, in, DType::BF16, false), f = run_gpu(fc, in, DType::BF16, false);
  ASSERT_EQ(c.stats.size(), 3u);
  ASSERT_EQ(f.stats.size(), 3u);
  for (size_t h = 0; h < 3; ++h) {
    const AttentionHeadStats &a = c.stats[h], &b = f.stats[h];
    std::printf("parity cudnn stats head %zu: rows %lld tied %lld/%lld p_one %lld/%lld entropy %.9g/%.9g (cudnn/flash)\n",
                h, (long long)a.rows, (long long)a.tied_rows, (long long)b.tied_rows, (long long)a.p_one,
                (long long)b.p_one, a.mean_entropy(), b.mean_entropy());
    EXPECT_EQ(a.rows, b.rows);
    EXPECT_EQ(a.tied_rows, b.tied_rows);
    EXPECT_EQ(a.max_logit, b.max_logit);
    EXPECT_EQ(a.p_tilde_one, -1);
    EXPECT_NEAR(a.entropy_sum, b.entropy_sum, 1e-9 * (1 + std::fabs(b.entropy_sum)));
  }
}

TEST_F(GpuCudnn, UnsupportedSettingsFail) {
  // Our rounding settings do not apply to NVIDIA's kernel: each is refused by name, as are
  // formats and head sizes cuDNN's fused attention does not take here.
  const Dims d{1, 16, 2, 64};
  const Inputs in = random_inputs(d, DType::BF16, 5);
  const std::vector<Bad> bad = {
      {"attention.scores", [](AttentionConfig& c) { c.scores = DType::F32; }},
      {"attention.accum", [](AttentionConfig& c) { c.accum = DType::BF16; }},
      {"attention.rule", [](AttentionConfig& c) { c.rule = RoundingRule::EveryOp; }},
      {"attention.delta", [](AttentionConfig& c) { c.delta = DeltaMode::DpP; }},
      {"attention.block_q", [](AttentionConfig& c) { c.block_q = 128; }},
      {"attention.beta", [](AttentionConfig& c) { c.beta = 3; }},
      {"attention.fp32_out_heads", [](AttentionConfig& c) { c.fp32_out_heads = {0}; }},
      {"bf16 or fp16 compute format", [](AttentionConfig&) {}, DType::F32},
  };
  expect_refused("cudnn ", cudnn_cfg(true), bad, in);
}

}  // namespace
}  // namespace st
