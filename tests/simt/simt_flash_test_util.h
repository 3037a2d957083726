// The parts of the SIMT emulator's flash tests (test_simt_flash.cpp: the parity cases and
// the statistics; test_simt_flash_sm90.cpp: the Hopper kernels and the launchers' refusals)
// that both files use: the CUDA class's plan run on emulated buffers, the CPU lab's results,
// the comparisons in ulps, and the parity cases' knobs. The inputs and ulp_at are
// tests/attention_test_util.h's. Host C++ for the emulator (label emu).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "core/attention.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "cuda/flash_plan.h"
#include "simt/simt_test_util.h"

namespace st::simt_flash {

using attn_test::Dims;
using attn_test::Inputs;
using attn_test::random_inputs;
using attn_test::stats_inputs;
using attn_test::ulp_at;
using simt_test::Buf;
using simt_test::dev;
using simt_test::host;
using simt_test::same_bytes;
using simt_test::two_schedules;

// ---------------------------------------------------------------- the CUDA class's plan

// FlashAttentionCuda's launches, through the same host code (cuda/flash_plan.cu): the
// formats resolved and checked, FwdParams / BwdParams filled, the kernels of the mode.
// saved: o32 (delta o_fp32, FP32) or the residual (o_split, fmt) or empty; ptilde: the P~ == 1
// counts (collect_stats) or empty.
inline flash::CallDims call_dims(const Dims& d) {
  return flash::CallDims{d.B, d.T, d.NH, d.hs};
}

inline void emulated_forward(const AttentionConfig& cfg, const Dims& d, DType fmt, const Buf& qkv,
                      const Buf& out, const Buf& lse, const Buf& saved, const Buf& ptilde) {
  flash::Buffers b;
  b.qkv = qkv.p();
  b.out = out.p();
  b.lse = lse.f();
  b.saved = saved.p();
  b.p_tilde_one = static_cast<int32_t*>(ptilde.p());
  flash::run_forward(cfg, flash::resolve_numerics(cfg, fmt), fmt, call_dims(d), b, nullptr);
}

inline void emulated_backward(const AttentionConfig& cfg, const Dims& d, DType fmt, const Buf& qkv,
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

inline CpuOut run_cpu(Backend& cpu, const AttentionConfig& cfg, const Inputs& in, DType fmt,
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
inline std::vector<double> values(const Buf& b, int part = -1, size_t last = 0) {
  std::vector<double> r;
  for (size_t i = 0; i < b.count; ++i) {
    if (part >= 0 && static_cast<int>((i % last) / (last / 3)) != part) continue;
    r.push_back(b.get(i));
  }
  return r;
}
inline std::vector<double> values(const Tensor& t, int part = -1) {
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
inline Err diff(const std::vector<double>& got, const std::vector<double>& want) {
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

// Prints the figure (in ulps of `unit` at the reference's largest magnitude) and checks it.
inline void expect_within(const std::string& name, const char* what, const Err& e, double tol,
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

inline std::string case_name(const Case& c) {
  std::string s = std::string(dtype_name(c.fmt)) + "_hs" + std::to_string(c.hs) + "_q" +
                  std::to_string(c.bq) + "k" + std::to_string(c.bk) +
                  (c.stab ? "_stab" : "_flash") + (c.acc_low ? "_acclow" : "_acc32") +
                  (c.scores_low ? "_sclow" : "_sc32") + "_" + delta_mode_name(c.delta) +
                  (c.causal ? "_causal" : "_noncausal") + "_T" + std::to_string(c.T) + "_B" +
                  std::to_string(c.B) + "NH" + std::to_string(c.NH);
  return s;
}
inline void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

inline AttentionConfig config_of(const Case& c) {
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

}  // namespace st::simt_flash
