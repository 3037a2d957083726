// The parts of the GPU flash tests (test_gpu_flash.cpp: our flash kernels; test_gpu_cudnn.cpp:
// cuDNN's fused attention; one executable, label gpu) that both files use: the inputs as host
// tensors (drawn by tests/attention_test_util.h), the GpuFlash fixture that runs an Attention
// on the GPU, the CPU and in FP64, and the parity checks with the tolerances that
// test_gpu_flash.cpp's opening comment gives.
#pragma once

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
#include "attention_test_util.h"
#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda/attention_cuda.h"
#include "cuda/flash_attention.h"
#include "gpu_test_util.h"

namespace st::gpu_flash {

using attn_test::Dims;

// Host tensors in FP32 storage holding values of the compute format (the CPU convention).
struct Inputs {
  Dims d;
  Tensor qkv, dout;
};

// tests/attention_test_util.h's inputs as host tensors.
inline Inputs tensors(const attn_test::Inputs& h) {
  Inputs in{h.d, Tensor::empty({h.d.B, h.d.T, 3 * h.d.C()}, DType::F32),
            Tensor::empty({h.d.B, h.d.T, h.d.C()}, DType::F32)};
  std::copy(h.qkv.begin(), h.qkv.end(), in.qkv.data<float>());
  std::copy(h.dout.begin(), h.dout.end(), in.dout.data<float>());
  return in;
}

// q ~ q_scale N(0,1) (q columns scaled: peakier rows), k, v, dout ~ N(0,1), rounded to fmt.
inline Inputs random_inputs(const Dims& d, DType fmt, uint64_t seed, double q_scale = 2.0) {
  return tensors(attn_test::random_inputs(d, fmt, seed, q_scale, false));
}

// Scores chosen exactly (attn_test::stats_inputs in BF16): S[b][h][t][s] = x_s of the (b, h)
// sequence x, for every query row t (q = e0 + e1 for all rows); values from a small set so
// that ties (exact and within tie_tol), ties across tiles and P~ == 1 all occur.
inline Inputs stats_inputs(int B, int NH, int T, uint64_t seed) {
  return tensors(attn_test::stats_inputs(DType::BF16, B, NH, T, seed));
}


struct Outputs {
  Tensor out, lse, dqkv;  // host; FP32 (FP64 for the reference)
  std::vector<float> delta, saved;
  std::vector<AttentionHeadStats> stats;
  std::string engine;             // cudnn: what cudnn_attention_describe says
  bool nondeterministic = false;  // cudnn: the backward engine's numerical notes say so
};

inline AttentionConfig flash_cfg(AttentionKind kind, bool causal, int bq = 64, int bk = 64) {
  AttentionConfig c;
  c.kind = kind;
  c.causal = causal;
  c.block_q = bq;
  c.block_k = bk;
  return c;
}

inline const char* kind_str(AttentionKind k) { return attention_kind_name(k); }

class GpuFlash : public GpuAndCpu {
 protected:
  Tensor to_gpu(const Tensor& host, DType fmt) {
    Tensor t = gpu_->alloc(host.shape(), fmt);
    gpu_->copy(t, host);
    return t;
  }
  Tensor to_host(const Tensor& dev) {
    Tensor h = Tensor::empty(dev.shape(), DType::F32);
    gpu_->copy(h, dev);
    return h;
  }
  // A device tensor full of NaN, so an element the kernels forget to write shows up.
  Tensor poisoned(const Shape& shape, DType fmt) {
    Tensor h = Tensor::empty(shape, DType::F32);
    std::fill(h.data<float>(), h.data<float>() + h.numel(), std::numeric_limits<float>::quiet_NaN());
    return to_gpu(h, fmt);
  }

  Outputs run_gpu(const AttentionConfig& cfg, const Inputs& in, DType fmt, bool backward = true) {
    const Dims& d = in.d;
    auto attn = gpu_->make_attention(cfg);
    const Tensor qkv = to_gpu(in.qkv, fmt), dout = to_gpu(in.dout, fmt);
    const Tensor out = poisoned({d.B, d.T, d.C()}, fmt), lse = poisoned({d.B, d.NH, d.T}, DType::F32);
    attn->forward(out, lse, qkv, d.NH, fmt);
    Outputs o;
    if (backward) {
      const Tensor dqkv = poisoned({d.B, d.T, 3 * d.C()}, fmt);
      attn->backward(dqkv, dout, qkv, out, lse, d.NH, fmt);
      o.dqkv = to_host(dqkv);
      if (cfg.kind != AttentionKind::Cudnn) o.delta = flash_cuda_last_delta(*attn);
    }
    gpu_->synchronize();
    o.out = to_host(out);
    o.lse = to_host(lse);
    if (cfg.kind != AttentionKind::Cudnn) {
      o.saved = flash_cuda_saved_o(*attn);
    } else {
      o.engine = cudnn_attention_describe(*attn);
      o.nondeterministic = backward && cudnn_attention_nondeterministic(*attn);
    }
    o.stats = attn->stats();
    return o;
  }

  Outputs run_cpu(const AttentionConfig& cfg, const Inputs& in, DType fmt, bool backward = true) {
    const Dims& d = in.d;
    auto attn = cpu_->make_attention(cfg);
    Outputs o;
    o.out = Tensor::empty({d.B, d.T, d.C()}, DType::F32);
    o.lse = Tensor::empty({d.B, d.NH, d.T}, DType::F32);
    attn->forward(o.out, o.lse, in.qkv, d.NH, fmt);
    if (backward) {
      o.dqkv = Tensor::empty({d.B, d.T, 3 * d.C()}, DType::F32);
      attn->backward(o.dqkv, in.dout, in.qkv, o.out, o.lse, d.NH, fmt);
    }
    o.stats = attn->stats();
    return o;
  }

  // The error of make_attention(cfg) and one forward in format fmt ("" if none).
  std::string forward_error(const AttentionConfig& cfg, const Inputs& in, DType fmt) {
    const Dims& d = in.d;
    try {
      auto attn = gpu_->make_attention(cfg);
      const Tensor qkv = to_gpu(in.qkv, fmt);
      const Tensor out = gpu_->alloc({d.B, d.T, d.C()}, fmt), lse = gpu_->alloc({d.B, d.NH, d.T}, DType::F32);
      attn->forward(out, lse, qkv, d.NH, fmt);
      gpu_->synchronize();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  // FP64 reference: baseline attention computed in FP64 on the same (format-exact) inputs.
  Outputs run_f64(bool causal, const Inputs& in) {
    const Dims& d = in.d;
    AttentionConfig cfg;
    cfg.kind = AttentionKind::Baseline;
    cfg.causal = causal;
    auto attn = cpu_->make_attention(cfg);
    auto widen = [](const Tensor& t) {
      Tensor w = Tensor::empty(t.shape(), DType::F64);
      for (int64_t i = 0; i < t.numel(); ++i) w.data<double>()[i] = t.data<float>()[i];
      return w;
    };
    const Tensor qkv = widen(in.qkv), dout = widen(in.dout);
    Outputs o;
    o.out = Tensor::empty({d.B, d.T, d.C()}, DType::F64);
    o.lse = Tensor::empty({d.B, d.NH, d.T}, DType::F64);
    o.dqkv = Tensor::empty({d.B, d.T, 3 * d.C()}, DType::F64);
    attn->forward(o.out, o.lse, qkv, d.NH, DType::F64);
    attn->backward(o.dqkv, dout, qkv, o.out, o.lse, d.NH, DType::F64);
    return o;
  }

  // A setting the Attention class must refuse: its key, how to set it, the compute format.
  struct Bad {
    const char* key;
    std::function<void(AttentionConfig&)> set;
    DType fmt = DType::BF16;
  };
  // Each of `bad` applied to `base`: one line naming its key, at make_attention or at the first
  // forward; printed as "  <who><key> -> <error>".
  void expect_refused(const char* who, const AttentionConfig& base, const std::vector<Bad>& bad,
                      const Inputs& in) {
    for (const Bad& b : bad) {
      AttentionConfig cfg = base;
      b.set(cfg);
      const std::string msg = forward_error(cfg, in, b.fmt);
      std::printf("  %s%s -> %s\n", who, b.key, msg.c_str());
      EXPECT_NE(msg.find(b.key), std::string::npos)
          << "expected an error naming " << b.key << ", got '" << msg << "'";
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }

};

// Values of a host tensor as doubles; `part` selects third `part` of the last axis (0 q,
// 1 k, 2 v of a (B, T, 3C) tensor), -1 the whole tensor.
inline std::vector<double> values(const Tensor& t, int part = -1) {
  const int64_t n = t.numel(), last = t.dim(-1);
  std::vector<double> r;
  r.reserve(static_cast<size_t>(part < 0 ? n : n / 3));
  for (int64_t i = 0; i < n; ++i) {
    if (part >= 0 && (i % last) / (last / 3) != part) continue;
    r.push_back(t.dtype() == DType::F64 ? t.data<double>()[i] : t.data<float>()[i]);
  }
  return r;
}

struct Err {
  double max_abs = 0, max_ref = 0;
  bool nonfinite = false;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};
inline Err compare(const std::vector<double>& a, const std::vector<double>& ref) {
  Err e;
  if (a.size() != ref.size()) {
    e.nonfinite = true;
    return e;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) e.nonfinite = true;
    e.max_abs = std::max(e.max_abs, std::fabs(a[i] - ref[i]));
    e.max_ref = std::max(e.max_ref, std::fabs(ref[i]));
  }
  return e;
}

// One ulp of the compute format fmt at |x| (normal range): tests/attention_test_util.h's
// ulp_at, asked for BF16 or else FP16, as this test's own copy did (its F32 gave fp16's ulp;
// every caller here passes BF16 or F16).
inline double ulp_at(double x, DType fmt) {
  return attn_test::ulp_at(x, fmt == DType::BF16 ? DType::BF16 : DType::F16);
}

inline std::string case_name(const AttentionConfig& cfg, const Dims& d, DType fmt) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s %s hs=%d T=%d B=%d NH=%d %s tiles=%dx%d scores=%s accum=%s",
                kind_str(cfg.kind), dtype_name(fmt), d.hs, d.T, d.B, d.NH,
                cfg.causal ? "causal" : "noncausal", cfg.block_q, cfg.block_k,
                cfg.scores ? dtype_name(*cfg.scores) : "fp32", cfg.accum ? dtype_name(*cfg.accum) : "fp32");
  return buf;
}

// Parity of every output against the CPU lab; prints "parity flash" lines.
// lse = m + log(l), l = sum of P~ = round_T(exp(S - m)). The GPU's S differs from the CPU's
// by a few FP32 ulps (MMA order), which is FP32-close for lse, unless a P~ lands next to a
// rounding boundary of T and the two sides round it to neighbours (seen on the first GPU
// run: up to 1.4e-3 where FP32 closeness is 5e-4). Such a flip moves P~ by one T ulp,
// at most 2^-mant P~, so l by at most 2^-mant l and lse by at most 2^-mant (mant = 7
// bf16, 10 fp16). With scores rounded to T, a score may flip by one T ulp too, which moves
// lse by at most ulp_T(|S|) p where p <= 1: bounded by 2^-mant max(1, |lse|) (scores that
// matter lie within a few units of lse). Flips are rare, so most rows must be FP32-close:
// at most 5% of the rows may use the flip allowance.
inline void expect_lse_parity(const std::string& name, const Outputs& g, const Outputs& c,
                              DType fmt, bool scores_low) {
  const std::vector<double> a = values(g.lse), r = values(c.lse);
  ASSERT_EQ(a.size(), r.size()) << name << " lse";
  const double flip = std::ldexp(1.0, fmt == DType::BF16 ? -7 : -10);
  int64_t loose = 0, beyond = 0;
  double max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - r[i]);
    max_abs = std::max(max_abs, std::isfinite(d) ? d : INFINITY);
    const double tight = 5e-5 * (1 + std::fabs(r[i]));
    const double allowance = flip * (1 + (scores_low ? std::max(1.0, std::fabs(r[i])) : 0.0));
    if (!(d <= tight)) ++loose;
    if (!(d <= tight + allowance) && ++beyond <= 3) {
      ADD_FAILURE() << name << " lse row " << i << ": GPU " << a[i] << ", CPU " << r[i]
                    << ", beyond one rounding flip (" << tight + allowance << ")";
    }
  }
  const int64_t rows = static_cast<int64_t>(a.size());
  std::printf("parity flash %s lse max_abs=%.3e rows_beyond_fp32=%lld/%lld\n", name.c_str(),
              max_abs, static_cast<long long>(loose), static_cast<long long>(rows));
  EXPECT_EQ(beyond, 0) << name << " lse";
  EXPECT_LE(loose, std::max<int64_t>(1, rows / 20)) << name << " lse: too many rows off";
}

inline void expect_parity(const std::string& name, const Outputs& g, const Outputs& c, DType fmt,
                   double grad_ulps, bool scores_low = false) {
  struct Item {
    const char* what;
    Err e;
    double tol;
  };
  std::vector<Item> items;
  Err eo = compare(values(g.out), values(c.out));
  items.push_back({"O", eo, 4 * ulp_at(eo.max_ref, fmt)});
  expect_lse_parity(name, g, c, fmt, scores_low);
  if (g.dqkv.defined()) {
    const char* names[3] = {"dQ", "dK", "dV"};
    for (int p = 0; p < 3; ++p) {
      Err e = compare(values(g.dqkv, p), values(c.dqkv, p));
      items.push_back({names[p], e, grad_ulps * ulp_at(e.max_ref, fmt) + 1e-5});
    }
  }
  for (const Item& it : items) {
    std::printf("parity flash %s %s max_abs=%.3e max_rel=%.3e tol=%.3e%s\n", name.c_str(), it.what,
                it.e.max_abs, it.e.rel(), it.tol, it.e.nonfinite ? " NONFINITE" : "");
    EXPECT_FALSE(it.e.nonfinite) << name << " " << it.what;
    EXPECT_LE(it.e.max_abs, it.tol) << name << " " << it.what;
  }
}

}  // namespace st::gpu_flash
