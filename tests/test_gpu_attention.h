// The parts of the GPU baseline attention tests (test_gpu_attention.cpp: parity, FP64,
// determinism; test_gpu_attention_stats.cpp: statistics and refused settings; one executable,
// label gpu) that both files use: the GpuAttention fixture, the problems and their inputs,
// host <-> device copies with NaN-poisoned outputs, and one forward (and backward) run.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/attention.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "gpu_test_util.h"

namespace st::gpu_attention {

using Vals = std::vector<double>;

class GpuAttention : public GpuAndCpu {};

struct Problem {
  int B, T, NH, hs;
  bool causal;
  int64_t C() const { return static_cast<int64_t>(NH) * hs; }
  std::string label() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
           " hs=" + std::to_string(hs) + (causal ? " causal" : " full");
  }
};

// Values already representable in the compute format, so both backends see the same ones.
struct Inputs {
  Vals qkv, dout;  // (B, T, 3C), (B, T, C)
};

inline Inputs make_inputs(const Problem& p, DType f, uint64_t seed) {
  Rng rng(seed);
  const int64_t C = p.C(), rows = static_cast<int64_t>(p.B) * p.T;
  Inputs in;
  in.qkv.resize(rows * 3 * C);
  for (int64_t i = 0; i < rows * 3 * C; ++i) {
    // q, k with std 1.2: scores of std ~1.4, rows from flat to peaked; v std 1.
    const double sc = (i % (3 * C)) < 2 * C ? 1.2 : 1.0;
    in.qkv[i] = round_fmt(sc * rng.normal(), f);
  }
  in.dout.resize(rows * C);
  for (double& x : in.dout) x = round_fmt(rng.normal(), f);
  return in;
}

inline DType host_dtype(DType storage) {
  return storage == DType::F64 ? DType::F64 : DType::F32;
}

inline Tensor host_tensor(const Vals& x, const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  for (size_t i = 0; i < x.size(); ++i) {
    if (dt == DType::F64)
      t.data<double>()[i] = x[i];
    else
      t.data<float>()[i] = static_cast<float>(x[i]);
  }
  return t;
}

inline Tensor upload(Backend& be, const Vals& x, const Shape& shape, DType storage) {
  Tensor d = be.alloc(shape, storage);
  be.copy(d, host_tensor(x, shape, host_dtype(storage)));
  return d;
}

inline Tensor poisoned(Backend& be, const Shape& shape, DType storage) {
  const Vals nan(static_cast<size_t>(shape_numel(shape)), std::numeric_limits<double>::quiet_NaN());
  return upload(be, nan, shape, storage);
}

inline Vals download(Backend& be, const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), host_dtype(t.dtype()));
  be.copy(h, t);  // exact widening from bf16 / fp16
  Vals x(static_cast<size_t>(h.numel()));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = h.dtype() == DType::F64 ? h.data<double>()[i] : h.data<float>()[i];
  return x;
}

struct Result {
  Vals out, lse, dqkv;
  std::vector<AttentionHeadStats> stats;
};

// One forward (and backward) of `attn` on backend `be` in compute format f. Outputs start
// as NaN. lse is FP32 on the GPU, the storage format on the CPU.
inline Result run(Backend& be, Attention& attn, const Problem& p, DType f, const Inputs& in,
           bool backward = true) {
  const DType st = be.storage_dtype(f);
  const DType lse_dt = be.device() == Device::CUDA ? DType::F32 : st;
  const int64_t B = p.B, T = p.T, C = p.C();
  Tensor qkv = upload(be, in.qkv, {B, T, 3 * C}, st);
  Tensor out = poisoned(be, {B, T, C}, st), lse = poisoned(be, {B, p.NH, T}, lse_dt);
  attn.forward(out, lse, qkv, p.NH, f);
  Result r;
  r.out = download(be, out);
  r.lse = download(be, lse);
  r.stats = attn.stats();
  if (backward) {
    Tensor dout = upload(be, in.dout, {B, T, C}, st);
    Tensor dqkv = poisoned(be, {B, T, 3 * C}, st);
    attn.backward(dqkv, dout, qkv, out, lse, p.NH, f);
    r.dqkv = download(be, dqkv);
  }
  return r;
}

inline Result run(Backend& be, const AttentionConfig& cfg, const Problem& p, DType f,
                  const Inputs& in, bool backward = true) {
  auto attn = be.make_attention(cfg);
  return run(be, *attn, p, f, in, backward);
}

inline AttentionConfig baseline(bool causal) {
  AttentionConfig c;
  c.kind = AttentionKind::Baseline;
  c.causal = causal;
  return c;
}

inline int mantissa_bits(DType f) {
  return f == DType::BF16 ? 7 : f == DType::F16 ? 10 : 23;
}

inline bool same_bits(const Vals& a, const Vals& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}


}  // namespace st::gpu_attention
