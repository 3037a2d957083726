// The CUDA flash / stabilized-flash attention kernels (cuda/flash_fwd.cuh, flash_bwd.cuh,
// flash_aux.cu) run by the SIMT emulator through their own host launchers
// (cuda/flash_launch.cuh), on host buffers, against the CPU backend's flash attention
// (attention/head_cpu.cpp through the CPU Attention class) on the same inputs. Label emu.
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
#include "simt/simt_test_util.h"

namespace st {
namespace {

using simt_test::Buf;
using simt_test::dev;
using simt_test::host;
using simt_test::same_bytes;
using simt_test::two_schedules;

// ---------------------------------------------------------------- inputs

struct Dims {
  int B, T, NH, hs;
  int C() const { return NH * hs; }
  size_t rows() const { return static_cast<size_t>(B) * NH * T; }        // (B, NH, T)
  size_t n_out() const { return static_cast<size_t>(B) * T * C(); }      // (B, T, C)
  size_t n_qkv() const { return static_cast<size_t>(B) * T * 3 * C(); }  // (B, T, 3C)
};

// Host values of the compute format in FP32 storage (the CPU convention).
struct Inputs {
  Dims d;
  std::vector<float> qkv, dout;
};

// The keys made identical in the tied-maxima inputs: both inside the first key tile of
// every tile size, and visible to causal rows t >= kTieB.
constexpr int kTieA = 2, kTieB = 5;

// q ~ q_scale N(0,1), k, v, dout ~ N(0,1), rounded to fmt (tests/test_gpu_flash.cpp's
// random_inputs: q columns scaled, peakier rows). tie: in every (b, h), keys kTieA and kTieB
// are one vector w ~ 3 N(0,1): their scores are identical in every format and order, and
// large (std 3 q_scale against q_scale for the other keys), so in many rows they are the
// tile's (and the row's) maximum, tied: the stabilized shift m' = r_m + min(shift, cap)
// is taken there (and capped for fp16, whose cap is 4.85).
Inputs random_inputs(const Dims& d, DType fmt, uint64_t seed, double q_scale, bool tie) {
  Inputs in{d, std::vector<float>(d.n_qkv()), std::vector<float>(d.n_out())};
  Rng rng(seed);
  const int C = d.C();
  for (size_t i = 0; i < in.qkv.size(); ++i) {
    const double s = static_cast<int>(i % (3 * C)) < C ? q_scale : 1.0;
    in.qkv[i] = round_to(fmt, static_cast<float>(s * rng.normal()));
  }
  for (float& g : in.dout) g = round_to(fmt, static_cast<float>(rng.normal()));
  if (tie) {
    for (int b = 0; b < d.B; ++b)
      for (int h = 0; h < d.NH; ++h) {
        std::vector<float> w(d.hs);
        for (float& x : w) x = round_to(fmt, static_cast<float>(3.0 * rng.normal()));
        for (int s : {kTieA, kTieB}) {
          if (s >= d.T) continue;
          for (int j = 0; j < d.hs; ++j)
            in.qkv[(static_cast<size_t>(b) * d.T + s) * 3 * C + C + h * d.hs + j] = w[j];
        }
      }
  }
  return in;
}

// tests/test_gpu_flash.cpp's stats_inputs in format fmt: scores chosen exactly,
// S[b][h][t][s] = x_s for every query row t (q = e0 + e1, k[0] + k[1] = 8 x_s as a hi/lo pair
// of fmt values, scale 1/8); values from a small set so that ties (exact and within
// tie_tol), ties across tiles and P~ == 1 all occur. V ~ N(0,1).
Inputs stats_inputs(DType fmt, int B, int NH, int T, uint64_t seed) {
  const Dims d{B, T, NH, 64};
  const int C = d.C();
  Inputs in{d, std::vector<float>(d.n_qkv(), 0.0f), std::vector<float>(d.n_out(), 0.0f)};
  Rng rng(seed);
  const double set[] = {0.0, 0.5, 1.0, 2.0, 3.0, 3.0 + 0x1p-11, -1.0, 4.0};
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int s = 0; s < T; ++s) {
        const size_t row = (static_cast<size_t>(b) * T + s) * 3 * C + h * 64;
        in.qkv[row] = in.qkv[row + 1] = 1.0f;
        const double u = rng.uniform();
        const double x = u < 0.02 ? 5.0 : u < 0.03 ? 5.0 - 0x1p-11 : set[rng.below(8)];
        const double X = 8 * x;
        const double hi = round_fmt(X, fmt);
        in.qkv[row + C] = static_cast<float>(hi);
        in.qkv[row + C + 1] = static_cast<float>(round_fmt(X - hi, fmt));
        for (int j = 0; j < 64; ++j)
          in.qkv[row + 2 * C + j] = round_to(fmt, static_cast<float>(rng.normal()));
      }
  return in;
}

// ---------------------------------------------------------------- the CUDA class's plan

// FlashAttentionCuda's launches, through the same host code (cuda/flash_plan.cu): the
// formats resolved and checked, FwdParams / BwdParams filled, the kernels of the mode.
// saved: o32 (delta o_fp32, FP32) or the residual (o_split, fmt) or empty; ptilde: the P~ == 1
// counts (collect_stats) or empty.
flash::CallDims call_dims(const Dims& d) {
  return flash::CallDims{d.B, d.T, d.NH, d.hs};
}

void emulated_forward(const AttentionConfig& cfg, const Dims& d, DType fmt, const Buf& qkv,
                      const Buf& out, const Buf& lse, const Buf& saved, const Buf& ptilde) {
  flash::Buffers b;
  b.qkv = qkv.p();
  b.out = out.p();
  b.lse = lse.f();
  b.saved = saved.p();
  b.p_tilde_one = static_cast<int32_t*>(ptilde.p());
  flash::run_forward(cfg, flash::resolve_numerics(cfg, fmt), fmt, call_dims(d), b, nullptr);
}

void emulated_backward(const AttentionConfig& cfg, const Dims& d, DType fmt, const Buf& qkv,
                       const Buf& dout, const Buf& out, const Buf& lse, const Buf& saved,
                       const Buf& delta, const Buf& dqkv) {
  flash::Buffers b;
  b.qkv = qkv.p();
  b.out = out.p();
  b.lse = lse.f();
  b.saved = saved.p();
  b.dout = dout.p();
  b.delta = delta.f();
  b.dqkv = dqkv.p();
  flash::run_backward(cfg, flash::resolve_numerics(cfg, fmt), fmt, call_dims(d), b, nullptr);
}

// ---------------------------------------------------------------- the CPU side

struct CpuOut {
  Tensor out, lse, dqkv;  // FP32 storage
  std::vector<AttentionHeadStats> stats;
};

CpuOut run_cpu(Backend& cpu, const AttentionConfig& cfg, const Inputs& in, DType fmt,
               bool backward) {
  const Dims& d = in.d;
  auto attn = cpu.make_attention(cfg);
  CpuOut o;
  const Tensor qkv = host(in.qkv, {d.B, d.T, 3 * d.C()});
  o.out = Tensor::empty({d.B, d.T, d.C()}, DType::F32);
  o.lse = Tensor::empty({d.B, d.NH, d.T}, DType::F32);
  attn->forward(o.out, o.lse, qkv, d.NH, fmt);
  if (backward) {
    o.dqkv = Tensor::empty({d.B, d.T, 3 * d.C()}, DType::F32);
    attn->backward(o.dqkv, host(in.dout, {d.B, d.T, d.C()}), qkv, o.out, o.lse, d.NH, fmt);
  }
  o.stats = attn->stats();
  return o;
}

// ---------------------------------------------------------------- comparisons

// Values as doubles; `part` selects third `part` of the last axis `last` (0 q, 1 k, 2 v of
// a (B, T, 3C) tensor), -1 everything.
std::vector<double> values(const Buf& b, int part = -1, size_t last = 0) {
  std::vector<double> r;
  for (size_t i = 0; i < b.count; ++i) {
    if (part >= 0 && static_cast<int>((i % last) / (last / 3)) != part) continue;
    r.push_back(b.get(i));
  }
  return r;
}
std::vector<double> values(const Tensor& t, int part = -1) {
  const float* p = static_cast<const float*>(t.raw());
  const size_t n = static_cast<size_t>(t.numel()), last = static_cast<size_t>(t.dim(-1));
  std::vector<double> r;
  for (size_t i = 0; i < n; ++i) {
    if (part >= 0 && static_cast<int>((i % last) / (last / 3)) != part) continue;
    r.push_back(p[i]);
  }
  return r;
}

struct Err {
  double max_abs = 0, max_ref = 0;
  size_t worst = 0, exact = 0, total = 0;
  bool nonfinite = false;
};
Err diff(const std::vector<double>& got, const std::vector<double>& want) {
  Err e;
  e.total = want.size();
  if (got.size() != want.size()) {
    ADD_FAILURE() << "size " << got.size() << " vs " << want.size();
    e.nonfinite = true;
    return e;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) e.nonfinite = true;
    const double a = std::fabs(got[i] - want[i]);
    if (a > e.max_abs) e.max_abs = a, e.worst = i;
    e.max_ref = std::max(e.max_ref, std::fabs(want[i]));
    e.exact += got[i] == want[i];
  }
  return e;
}

// One ulp of format fmt at |x| (normal range), as tests/test_gpu_flash.cpp's ulp_at.
double ulp_at(double x, DType fmt) {
  const int mant = fmt == DType::BF16 ? 7 : fmt == DType::F16 ? 10 : 23;
  if (x <= 0) return 0;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(x))) - mant);
}

// Prints the figure (in ulps of `unit` at the reference's largest magnitude) and checks it.
void expect_within(const std::string& name, const char* what, const Err& e, double tol,
                   DType unit) {
  const double u = ulp_at(e.max_ref, unit);
  std::printf(
      "simt flash %s %-5s max_abs=%.3e = %7.3f ulp(%s at max|ref| %.3e) tol=%.3e = %.2f ulp "
      "exact=%zu/%zu%s\n",
      name.c_str(), what, e.max_abs, u > 0 ? e.max_abs / u : 0.0, dtype_name(unit), e.max_ref, tol,
      u > 0 ? tol / u : 0.0, e.exact, e.total, e.nonfinite ? " NONFINITE" : "");
  EXPECT_FALSE(e.nonfinite) << name << " " << what << ": an element is not finite (unwritten?)";
  EXPECT_LE(e.max_abs, tol) << name << " " << what << ": worst element " << e.worst;
}

// ---------------------------------------------------------------- cases

struct Case {
  DType fmt;
  int hs, bq, bk;
  bool stab, acc_low, scores_low;
  DeltaMode delta;
  bool causal;
  int T, B, NH;
  uint64_t seed;
};

std::string case_name(const Case& c) {
  std::string s = std::string(dtype_name(c.fmt)) + "_hs" + std::to_string(c.hs) + "_q" +
                  std::to_string(c.bq) + "k" + std::to_string(c.bk) +
                  (c.stab ? "_stab" : "_flash") + (c.acc_low ? "_acclow" : "_acc32") +
                  (c.scores_low ? "_sclow" : "_sc32") + "_" + delta_mode_name(c.delta) +
                  (c.causal ? "_causal" : "_noncausal") + "_T" + std::to_string(c.T) + "_B" +
                  std::to_string(c.B) + "NH" + std::to_string(c.NH);
  return s;
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

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

AttentionConfig config_of(const Case& c) {
  AttentionConfig cfg;
  cfg.kind = c.stab ? AttentionKind::StabilizedFlash : AttentionKind::Flash;
  cfg.causal = c.causal;
  cfg.block_q = c.bq;
  cfg.block_k = c.bk;
  cfg.delta = c.delta;
  if (c.scores_low) cfg.scores = c.fmt;  // attention.scores: the compute format
  if (c.acc_low) cfg.accum = c.fmt;      // attention.accum: the compute format
  return cfg;
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
      std::printf(
          "simt flash %s head %zu: rows %lld/%lld tied %lld/%lld in_tile %lld/%lld "
          "p_one %lld/%lld p_tilde_one %lld/%lld max_logit %.9g/%.9g entropy %.12g/%.12g "
          "(emulated/cpu)\n",
          name.c_str(), h, (long long)a.rows, (long long)b.rows, (long long)a.tied_rows,
          (long long)b.tied_rows, (long long)a.tied_in_tile, (long long)b.tied_in_tile,
          (long long)a.p_one, (long long)b.p_one, (long long)a.p_tilde_one,
          (long long)b.p_tilde_one, a.max_logit, b.max_logit, a.mean_entropy(), b.mean_entropy());
      EXPECT_EQ(a.rows, b.rows);
      EXPECT_EQ(a.tied_rows, b.tied_rows);
      EXPECT_EQ(a.tied_in_tile, b.tied_in_tile);
      EXPECT_EQ(a.p_one, b.p_one);
      EXPECT_EQ(a.p_tilde_one, b.p_tilde_one);
      if (run.dominant) {
        // Seen: 25, 28 rows of 70 (BF16: P = 1 from 1 - 2^-9), 16, 18 (FP16: 1 - 2^-12).
        EXPECT_GT(b.p_one, d.T / 8) << "q scaled by 12 should give many rows with P = 1";
      }
      if (run.exact) {
        EXPECT_EQ(a.max_logit, b.max_logit);
        EXPECT_GT(b.tied_rows, 0) << "the construction should tie row maxima";
      } else {
        EXPECT_NEAR(a.max_logit, b.max_logit, 1e-6 * (1 + std::fabs(b.max_logit)));
      }
      EXPECT_NEAR(a.entropy_sum, b.entropy_sum, 1e-9 * (1 + std::fabs(b.entropy_sum)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, SimtFlashStats, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

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
