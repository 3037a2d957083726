// The CUDA flash / stabilized-flash attention kernels (cuda/flash_fwd.cuh, flash_bwd.cuh,
// flash_aux.cu) run by the SIMT emulator through their own host launchers
// (cuda/flash_launch.cuh), on host buffers, against the CPU backend's flash attention
// (attention/head_cpu.cpp through the CPU Attention class) on the same inputs: the parity
// cases and the statistics here; the Hopper kernels and the launchers' refusals in
// test_simt_flash_sm90.cpp, the helpers both use in simt_flash_test_util.h. Label emu.
//
// The CUDA Attention class (cuda/flash_attention.cu) needs CudaBackend, which the emulator
// does not provide; its host-side plan does not: the formats it resolves and checks, the
// FwdParams / BwdParams it fills and the launch sequence of each mode live in
// cuda/flash_plan.cu, which the class and this test both call.
//
// Every output the kernels write starts as NaN (0xFF bytes: NaN in bf16, fp16 and fp32,
// -1 in int32), so an element a kernel forgets to write shows up as non-finite. Each case
// runs under two schedules (seeds 1 and 2: other thread interleavings and block orders),
// which must give identical bits, pass the emulator's shared-memory checks (simt::failures()
// unchanged) and leave cudaGetLastError() == cudaSuccess.
//
// Tolerances: those of tests/test_gpu_flash.cpp for the same quantities, for the same
// reasons. The kernels round at the CPU lab's points (same formats, same tiles); what
// differs is FP32 arithmetic below those points: the MMA's summation (the emulator's
// mma.sync sums the 16 products exactly in FP64 and rounds once to FP32, the CPU runs a
// sequential FP32 FMA chain), exp as one FP32 multiply by log2(e) and exp2f (the emulator's
// ex2.approx) instead of FP64 exp, and FP32 instead of FP64 for S - m. Those are a few FP32
// ulps; they matter only where a value sits next to a rounding boundary of the low format,
// which then flips by one low-format ulp (P~, dS, the stored O and gradients, and in accum =
// low mode the accumulators). So parity is judged in low-format ulps of the output tensor's
// largest magnitude: O within 4 ulps, gradients within 8 (they sum many rounded dS, P terms),
// 16 in the accum = low mode (each tile's accumulator rounding can flip); lse (FP32) within
// 5e-5 (1 + max|lse|). delta: o, o_split and o_fp32 run the CPU's sequential FMA chain
// (flash_aux.cu) and must be bit-identical to the CPU's head_deltas fed the emulated
// forward's own O, lse and saved o32 / residual; dp_p recomputes P and dP with MMAs, so
// within 1e-3 of the largest |delta| (2e-2 when dP is rounded to the low format). Every
// figure is printed on a line starting with "simt flash" (max error in ulps of the output's
// format at its largest reference magnitude, and how many elements are bit-identical).
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

// ---------------------------------------------------------------- cases

// The cases (the same six for bf16 and fp16). Not the cross product: each knob takes each
// of its values at least once per format, both head sizes and all three forward tiles
// appear (each tile once per head size), and the emulated cost stays small (the backward's
// 256-thread blocks dominate; hs 128 costs twice hs 64, so its cases are short).
//   hs  tiles (bq,bk)  kind  accum  scores  delta    causal     T    B  NH
//   64  (64, 64)       flash fp32   fp32    o        causal     77   1  2   several q/kv tiles, 2
//   heads 64  (128, 64)      stab  fp32   low     o_split  noncausal  37   2  1   ties; 2 batches
//   64  (128, 128)     flash low    fp32    o_fp32   causal     100  1  1   bwd accum flush per 128
//  128  (64, 64)       stab  low    low     dp_p     causal     37   1  1   ties
//  128  (128, 64)      flash fp32   fp32    dp_p     noncausal  77   1  1
//  128  (128, 128)     stab  low    fp32    o        causal     37   1  1   ties
// Per format: stab off/on, accum fp32/low, scores fp32/low, every delta mode, causal and
// not, T = 37, 77, 100 (no multiple of 64 or 128). The stabilized cases use the tied-keys
// inputs; each asserts that the CPU saw rows with tied maxima inside one key tile.
std::vector<Case> all_cases() {
  struct Row {
    int hs, bq, bk;
    bool stab, acc_low, scores_low;
    DeltaMode delta;
    bool causal;
    int T, B, NH;
  };
  const Row rows[] = {
      {64, 64, 64, false, false, false, DeltaMode::O, true, 77, 1, 2},
      {64, 128, 64, true, false, true, DeltaMode::OSplit, false, 37, 2, 1},
      {64, 128, 128, false, true, false, DeltaMode::OFp32, true, 100, 1, 1},
      {128, 64, 64, true, true, true, DeltaMode::DpP, true, 37, 1, 1},
      {128, 128, 64, false, false, false, DeltaMode::DpP, false, 77, 1, 1},
      {128, 128, 128, true, true, false, DeltaMode::O, true, 37, 1, 1},
  };
  std::vector<Case> cases;
  uint64_t seed = 4000;
  for (DType fmt : {DType::BF16, DType::F16})
    for (const Row& r : rows)
      cases.push_back(Case{fmt, r.hs, r.bq, r.bk, r.stab, r.acc_low, r.scores_low, r.delta,
                           r.causal, r.T, r.B, r.NH, ++seed});
  return cases;
}

// The delta the emulated backward used against the CPU's head_deltas fed the emulated
// forward's own results (O, lse, and the saved o32 / residual), so the comparison isolates
// the delta computation (tests/test_gpu_flash.cpp DeltaModesMatchCpu): o, o_split, o_fp32
// are the CPU's sequential FMA chain and must be bit-identical (o_split: both take hi = the
// stored O and lo = the saved residual; the CPU re-derives lo = round(o32 - O) from
// o32 = O + lo, which is lo exactly); dp_p recomputes P and dP with MMAs: within 1e-3 of
// the largest |delta|, 2e-2 in accum = low mode (dP rounded to the low format).
void check_delta(const std::string& name, const AttentionConfig& cfg, const Dims& d, DType fmt,
                 const Inputs& in, const Buf& out, const Buf& lse, const Buf& saved,
                 const Buf& delta) {
  const AttnNumerics n = cfg.numerics(fmt, 0);
  const int C = d.C();
  std::vector<double> got, want;
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h) {
      const size_t td = static_cast<size_t>(d.T) * d.hs;
      std::vector<double> q(td), k(td), v(td), dO(td);
      HeadForward fw;
      fw.o.resize(td);
      fw.o32.resize(td);
      fw.lse.resize(d.T);
      for (int t = 0; t < d.T; ++t) {
        fw.lse[t] = lse.get((static_cast<size_t>(b) * d.NH + h) * d.T + t);
        for (int j = 0; j < d.hs; ++j) {
          const size_t r3 = (static_cast<size_t>(b) * d.T + t) * 3 * C + h * d.hs + j;
          const size_t r1 = (static_cast<size_t>(b) * d.T + t) * C + h * d.hs + j;
          const size_t i = static_cast<size_t>(t) * d.hs + j;
          q[i] = in.qkv[r3];
          k[i] = in.qkv[r3 + C];
          v[i] = in.qkv[r3 + 2 * C];
          dO[i] = in.dout[r1];
          fw.o[i] = out.get(r1);
          if (n.delta == DeltaMode::OFp32) fw.o32[i] = saved.get(r1);
          if (n.delta == DeltaMode::OSplit) fw.o32[i] = fw.o[i] + saved.get(r1);
        }
      }
      const std::vector<double> cd =
          head_deltas(cfg, n, d.T, d.hs, q.data(), k.data(), v.data(), fw, dO.data());
      for (int t = 0; t < d.T; ++t) {
        got.push_back(delta.get((static_cast<size_t>(b) * d.NH + h) * d.T + t));
        want.push_back(cd[t]);
      }
    }
  const Err e = diff(got, want);
  const bool acc_low = n.accum != DType::F32;
  if (n.delta == DeltaMode::DpP) {
    expect_within(name, "delta", e, (acc_low ? 2e-2 : 1e-3) * e.max_ref + 1e-6, DType::F32);
  } else {
    expect_within(name, "delta", e, 0.0, DType::F32);
    EXPECT_EQ(e.exact, e.total) << name << ": delta (mode " << delta_mode_name(n.delta)
                                << ") must be the CPU's bits";
  }
}

// ---------------------------------------------------------------- parity

class SimtFlash : public ::testing::TestWithParam<Case> {
 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend(1);
};

TEST_P(SimtFlash, ForwardBackwardMatchCpu) {
  const Case& cs = GetParam();
  const DType fmt = cs.fmt;
  const Dims d{cs.B, cs.T, cs.NH, cs.hs};
  const AttentionConfig cfg = config_of(cs);
  const std::string name = case_name(cs);
  SCOPED_TRACE(name);
  const Inputs in = random_inputs(d, fmt, cs.seed, 2.0, cs.stab);

  // The CPU lab (with its statistics in the stabilized cases, to show the ties are there).
  AttentionConfig ccfg = cfg;
  ccfg.collect_stats = cs.stab;
  const CpuOut c = run_cpu(*cpu_, ccfg, in, fmt, true);
  if (cs.stab) {
    ASSERT_EQ(c.stats.size(), static_cast<size_t>(d.NH));
    int64_t tied = 0, in_tile = 0, rows = 0;
    for (const AttentionHeadStats& s : c.stats)
      tied += s.tied_rows, in_tile += s.tied_in_tile, rows += s.rows;
    std::printf("simt flash %s cpu rows=%lld tied=%lld tied_in_tile=%lld\n", name.c_str(),
                static_cast<long long>(rows), static_cast<long long>(tied),
                static_cast<long long>(in_tile));
    EXPECT_GT(in_tile, 0) << "the tied-keys inputs should tie row maxima inside one key tile";
  }

  // The kernels: forward, delta pass, dK/dV, dQ, as FlashAttentionCuda runs them.
  const AttnNumerics n = cfg.numerics(fmt, 0);
  const uint64_t sw0 = simt::stats().switches;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Buf> got = two_schedules([&] {
    const Buf qkv = dev(in.qkv, fmt), dout = dev(in.dout, fmt);
    const Buf out(fmt, d.n_out()), lse(DType::F32, d.rows()), delta(DType::F32, d.rows()),
        dqkv(fmt, d.n_qkv());
    Buf saved;
    if (n.delta == DeltaMode::OFp32) saved = Buf(DType::F32, d.n_out());
    if (n.delta == DeltaMode::OSplit) saved = Buf(fmt, d.n_out());
    emulated_forward(cfg, d, fmt, qkv, out, lse, saved, Buf());
    emulated_backward(cfg, d, fmt, qkv, dout, out, lse, saved, delta, dqkv);
    return std::vector<Buf>{out, lse, saved, delta, dqkv};
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("simt flash %s emulated (2 schedules) in %.2f s, %llu switches\n", name.c_str(), secs,
              static_cast<unsigned long long>(simt::stats().switches - sw0));
  ASSERT_EQ(got.size(), 5u);
  const Buf &out = got[0], &lse = got[1], &saved = got[2], &delta = got[3], &dqkv = got[4];

  // O within 4 ulps (of fmt at max|O|); lse within 5e-5 (1 + max|lse|).
  const Err eo = diff(values(out), values(c.out));
  expect_within(name, "O", eo, 4 * ulp_at(eo.max_ref, fmt), fmt);
  const Err el = diff(values(lse), values(c.lse));
  expect_within(name, "lse", el, 5e-5 * (1 + el.max_ref), DType::F32);
  // The saved O of o_fp32 (FP32) and o_split (stored O + residual), against the CPU's O:
  // they lie within half an ulp of the emulated O, itself within O's 4 ulps: 4.5, plus the
  // residual's own rounding (2^-9 of half an ulp) in o_split: 5 ulps.
  if (n.delta == DeltaMode::OFp32 || n.delta == DeltaMode::OSplit) {
    std::vector<double> o32 = values(saved);
    if (n.delta == DeltaMode::OSplit) {
      const std::vector<double> hi = values(out);
      for (size_t i = 0; i < o32.size(); ++i) o32[i] += hi[i];
    }
    const Err es = diff(o32, values(c.out));
    expect_within(name, n.delta == DeltaMode::OFp32 ? "o32" : "o+lo", es,
                  5 * ulp_at(es.max_ref, fmt), fmt);
  }
  check_delta(name, cfg, d, fmt, in, out, lse, saved, delta);
  // Gradients within 8 ulps, 16 with the low-precision accumulators; the 1e-5 floor as the
  // GPU test (gradients near 0 in a tensor of small magnitude).
  const double grad_ulps = cs.acc_low ? 16 : 8;
  const char* parts[3] = {"dQ", "dK", "dV"};
  const size_t last = static_cast<size_t>(3 * d.C());
  for (int p = 0; p < 3; ++p) {
    const Err e = diff(values(dqkv, p, last), values(c.dqkv, p));
    expect_within(name, parts[p], e, grad_ulps * ulp_at(e.max_ref, fmt) + 1e-5, fmt);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SimtFlash, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return case_name(i.param);
                         });

// ---------------------------------------------------------------- statistics

class SimtFlashStats : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend(1);
};

TEST_P(SimtFlashStats, RowStatsAndPOneMatchCpu) {
  // collect_stats as FlashAttentionCuda does it: p_tilde_one counted by the forward kernel,
  // the other fields by row_stats (flash_aux.cu), merged on the host, which derives p_one
  // from each row's max_logit and lse; against the CPU's stats() (p_one there: every entry
  // of P recomputed from lse, so the host's one-entry test is checked against a full count).
  // tests/test_gpu_flash.cpp StatsMatchCpu's checks: rows, tied_rows, tied_in_tile, p_one,
  // p_tilde_one and max_logit equal (the scores are exact in the constructed inputs, and row_stats forms S
  // as the CPU does, a sequential FP32 FMA chain); entropy to 1e-9 relative (FP64, another
  // order). Random inputs too: counts equal (no score sits within FP32 rounding of a tie
  // threshold or of P~ = 1 there), max_logit to 1e-6. O and lse are checked as in the parity
  // cases (4 ulps; 5e-5 (1 + max|lse|)). T = 70: two key tiles of 64, ties across tiles.
  // The third run scales q by 12 (scores of std ~12), so many rows are dominated by one key
  // and the normalised P = 1 (p_one) is common, not only in the one-key row 0.
  const DType fmt = GetParam();
  struct Run {
    Inputs in;
    bool exact;
    AttentionKind kind;
    bool causal;
    bool dominant = false;
  };
  std::vector<Run> runs;
  runs.push_back({stats_inputs(fmt, 1, 2, 70, 11), true, AttentionKind::StabilizedFlash, true});
  runs.push_back(
      {random_inputs({1, 70, 2, 64}, fmt, 12, 3.0, false), false, AttentionKind::Flash, false});
  runs.push_back({random_inputs({1, 70, 2, 64}, fmt, 13, 12.0, false), false,
                  AttentionKind::StabilizedFlash, true, true});
  for (const Run& run : runs) {
    const Dims& d = run.in.d;
    AttentionConfig cfg;
    cfg.kind = run.kind;
    cfg.causal = run.causal;
    cfg.collect_stats = true;
    const std::string name = std::string("stats ") + dtype_name(fmt) + " " +
                             (run.exact ? "exact " : "random ") + attention_kind_name(run.kind) +
                             (run.causal ? " causal" : " noncausal");
    SCOPED_TRACE(name);
    const CpuOut c = run_cpu(*cpu_, cfg, run.in, fmt, false);
    const AttnNumerics n = flash::resolve_numerics(cfg, fmt);
    const std::vector<Buf> got = two_schedules([&] {
      const Buf qkv = dev(run.in.qkv, fmt);
      const Buf out(fmt, d.n_out()), lse(DType::F32, d.rows()), ptilde(DType::I32, d.rows());
      const Buf rs(DType::F32, d.rows() * 4);  // 16-byte flash::RowStats per row
      emulated_forward(cfg, d, fmt, qkv, out, lse, Buf(), ptilde);
      flash::run_row_stats(cfg, n, fmt, call_dims(d), qkv.p(),
                           static_cast<flash::RowStats*>(rs.p()), nullptr);
      return std::vector<Buf>{out, lse, ptilde, rs};
    });
    ASSERT_EQ(got.size(), 4u);
    const Err eo = diff(values(got[0]), values(c.out));
    expect_within(name, "O", eo, 4 * ulp_at(eo.max_ref, fmt), fmt);
    const Err el = diff(values(got[1]), values(c.lse));
    expect_within(name, "lse", el, 5e-5 * (1 + el.max_ref), DType::F32);

    static_assert(sizeof(flash::RowStats) == 16, "RowStats is 4 floats");
    const std::vector<AttentionHeadStats> g =
        flash::merge_row_stats(call_dims(d), static_cast<const int32_t*>(got[2].p()),
                               got[1].f(), static_cast<const flash::RowStats*>(got[3].p()),
                               n.probs);
    ASSERT_EQ(c.stats.size(), static_cast<size_t>(d.NH));
    for (size_t h = 0; h < g.size(); ++h) {
      const AttentionHeadStats &a = g[h], &b = c.stats[h];
      attn_test::print_head_stats("simt flash " + name, h, a, b, "emulated/cpu");
      attn_test::expect_same_head_stats(a, b, run.exact);
      if (run.dominant) {
        // Seen: 25, 28 rows of 70 (BF16: P = 1 from 1 - 2^-9), 16, 18 (FP16: 1 - 2^-12).
        EXPECT_GT(b.p_one, d.T / 8) << "q scaled by 12 should give many rows with P = 1";
      }
      if (run.exact) {
        EXPECT_GT(b.tied_rows, 0) << "the construction should tie row maxima";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, SimtFlashStats, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace st
