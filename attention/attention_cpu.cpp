// The CPU attention backends (baseline, flash, stabilized flash) over the model's packed
// layout: qkv (B, T, 3C) -> out (B, T, C), lse (B, NH, T). Each (batch, head) pair is one
// independent head_forward/head_backward (attention/head_cpu.cpp) run in parallel; what
// the backward needs (P for baseline, the forward's O and lse) is kept per layer.
// FP32 tensors whose numerics the fast path reproduces (attention/head_fast.h: every
// `gpu`-rule setting of BF16/FP16/FP32 runs) go through it unless statistics are collected;
// everything else, and every FP64 run, goes through the lab. The two give the same bits.
#include <omp.h>

#include "attention/attention_cpu.h"
#include "attention/head_cpu.h"
#include "attention/head_fast.h"
#include "core/error.h"

namespace st {
namespace {

template <class S>
void gather(const S* qkv, int b, int h, int T, int C, int hs, int which, double* dst) {
  const size_t C3 = 3 * static_cast<size_t>(C);
  for (int t = 0; t < T; ++t) {
    const S* src = qkv + (static_cast<size_t>(b) * T + t) * C3 + which * C + h * hs;
    for (int j = 0; j < hs; ++j) dst[t * hs + j] = static_cast<double>(src[j]);
  }
}

template <class S>
void scatter(S* dst_base, size_t row_stride, int b, int h, int T, int hs, size_t col0,
             const double* src) {
  for (int t = 0; t < T; ++t) {
    S* dst = dst_base + (static_cast<size_t>(b) * T + t) * row_stride + col0 + h * hs;
    for (int j = 0; j < hs; ++j) dst[j] = static_cast<S>(src[t * hs + j]);
  }
}

class AttentionCpu : public Attention {
 public:
  AttentionCpu(const AttentionConfig& cfg, AttentionCpuPath path)
      : Attention(cfg.collect_stats), cfg_(cfg), force_lab_(path == AttentionCpuPath::Lab) {}
  std::string name() const override { return attention_kind_name(cfg_.kind); }
  std::string implementation() const override { return fast_ ? "fast" : "lab"; }

  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head,
               DType fmt) override {
    check_attention_args(out, lse, qkv, n_head);
    fast_ = false;
    if (qkv.dtype() == DType::F64)
      run_forward<double>(out, lse, qkv, n_head, fmt);
    else if (fast_applies(n_head, fmt))
      run_fast_forward(out, lse, qkv, n_head, fmt);
    else
      run_forward<float>(out, lse, qkv, n_head, fmt);
  }

  void backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                const Tensor& lse, int n_head, DType fmt) override {
    check_attention_args(out, lse, qkv, n_head);
    check_same(dqkv, qkv, "attention backward: dqkv vs qkv");
    check_same(dout, out, "attention backward: dout vs out");
    ST_CHECK(B_ == qkv.dim(0) && T_ == qkv.dim(1) && NH_ == n_head && fmt == fmt_,
             "attention backward called without a matching forward");
    if (qkv.dtype() == DType::F64)
      run_backward<double>(dqkv, dout, qkv, n_head, fmt);
    else if (fast_)
      run_fast_backward(dqkv, dout, qkv, n_head, fmt);
    else
      run_backward<float>(dqkv, dout, qkv, n_head, fmt);
  }

 private:
  bool fast_applies(int NH, DType fmt) const {
    return !force_lab_ && !collect_stats_ && head_fast_layer(cfg_, fmt, NH).eligible;
  }

  // Per (batch, head): q, k and v gathered into (T, hs) rows rounded to format f.
  static void gather_qkv_fast(const float* qkv, int b, int h, int T, int C, int hs, DType f,
                              float* q, float* k, float* v) {
    const size_t C3 = 3 * static_cast<size_t>(C);
    float* dst[3] = {q, k, v};
    for (int which = 0; which < 3; ++which)
      for (int t = 0; t < T; ++t) {
        const float* src = qkv + (static_cast<size_t>(b) * T + t) * C3 + which * C + h * hs;
        float* d = dst[which] + static_cast<size_t>(t) * hs;
        if (f == DType::F32)
          std::copy(src, src + hs, d);
        else
          for (int j = 0; j < hs; ++j) d[j] = round_to_float(src[j], f);
      }
  }

  HeadFastSaved fast_saved(int bh) {
    const size_t td = static_cast<size_t>(T_) * HS_;
    HeadFastSaved sv;
    sv.o = fo_.data() + bh * td;
    sv.o32 = fo32_.empty() ? nullptr : fo32_.data() + bh * td;
    sv.lse = flse_.data() + static_cast<size_t>(bh) * T_;
    sv.P = fP_.empty() ? nullptr : fP_.data() + bh * static_cast<size_t>(T_) * T_;
    return sv;
  }

  void run_fast_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int NH,
                        DType fmt) {
    const int B = static_cast<int>(qkv.dim(0)), T = static_cast<int>(qkv.dim(1));
    const int C = static_cast<int>(qkv.dim(2) / 3), hs = C / NH;
    B_ = B, T_ = T, NH_ = NH, HS_ = hs, fmt_ = fmt, fast_ = true;
    saved_.clear();
    stats_.clear();
    const size_t heads = static_cast<size_t>(B) * NH, td = static_cast<size_t>(T) * hs;
    fo_.resize(heads * td);
    flse_.resize(heads * T);
    if (head_fast_layer(cfg_, fmt, NH).keeps_o32) fo32_.resize(heads * td); else fo32_.clear();
    if (cfg_.kind == AttentionKind::Baseline) fP_.resize(heads * T * T); else fP_.clear();
    const float* src = qkv.data<float>();
    float* o = out.data<float>();
    float* l = lse.data<float>();
#pragma omp parallel
    {
      std::vector<float> q(td), k(td), v(td);
#pragma omp for schedule(dynamic)
      for (int bh = 0; bh < B * NH; ++bh) {
        const int b = bh / NH, h = bh % NH;
        const AttnNumerics n = cfg_.numerics(fmt, h);
        gather_qkv_fast(src, b, h, T, C, hs, n.qkv, q.data(), k.data(), v.data());
        const HeadFastSaved sv = fast_saved(bh);
        head_fast_forward(cfg_, n, T, hs, q.data(), k.data(), v.data(), sv);
        for (int t = 0; t < T; ++t)
          std::copy(sv.o + static_cast<size_t>(t) * hs, sv.o + static_cast<size_t>(t + 1) * hs,
                    o + (static_cast<size_t>(b) * T + t) * C + h * hs);
        std::copy(sv.lse, sv.lse + T, l + static_cast<size_t>(bh) * T);
      }
    }
  }

  void run_fast_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, int NH,
                         DType fmt) {
    const int B = B_, T = T_, C = static_cast<int>(qkv.dim(2) / 3), hs = C / NH;
    const float* src = qkv.data<float>();
    const float* dsrc = dout.data<float>();
    float* dst = dqkv.data<float>();
    const size_t C3 = 3 * static_cast<size_t>(C), td = static_cast<size_t>(T) * hs;
#pragma omp parallel
    {
      std::vector<float> q(td), k(td), v(td), dO(td), dq(td), dk(td), dv(td);
#pragma omp for schedule(dynamic)
      for (int bh = 0; bh < B * NH; ++bh) {
        const int b = bh / NH, h = bh % NH;
        const AttnNumerics n = cfg_.numerics(fmt, h);
        gather_qkv_fast(src, b, h, T, C, hs, n.qkv, q.data(), k.data(), v.data());
        for (int t = 0; t < T; ++t) {
          const float* g = dsrc + (static_cast<size_t>(b) * T + t) * C + h * hs;
          for (int j = 0; j < hs; ++j) dO[t * hs + j] = round_to_float(g[j], n.grads);
        }
        head_fast_backward(cfg_, n, T, hs, q.data(), k.data(), v.data(), fast_saved(bh),
                           dO.data(), dq.data(), dk.data(), dv.data());
        for (int t = 0; t < T; ++t) {
          float* row = dst + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
          const size_t at = static_cast<size_t>(t) * hs;
          std::copy(dq.data() + at, dq.data() + at + hs, row);
          std::copy(dk.data() + at, dk.data() + at + hs, row + C);
          std::copy(dv.data() + at, dv.data() + at + hs, row + 2 * static_cast<size_t>(C));
        }
      }
    }
  }

  template <class S>
  void run_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int NH, DType fmt) {
    const int B = static_cast<int>(qkv.dim(0)), T = static_cast<int>(qkv.dim(1));
    const int C = static_cast<int>(qkv.dim(2) / 3), hs = C / NH;
    B_ = B, T_ = T, NH_ = NH, fmt_ = fmt;
    for (auto* v : {&fo_, &fo32_, &flse_, &fP_}) std::vector<float>().swap(*v);  // lab's turn
    saved_.assign(static_cast<size_t>(B) * NH, HeadForward{});
    const S* src = qkv.data<S>();
    S* o = out.data<S>();
    S* l = lse.data<S>();
#pragma omp parallel
    {
      std::vector<double> q(static_cast<size_t>(T) * hs), k(q.size()), v(q.size());
#pragma omp for schedule(dynamic)
      for (int bh = 0; bh < B * NH; ++bh) {
        const int b = bh / NH, h = bh % NH;
        gather(src, b, h, T, C, hs, 0, q.data());
        gather(src, b, h, T, C, hs, 1, k.data());
        gather(src, b, h, T, C, hs, 2, v.data());
        HeadForward& fw = saved_[bh];
        head_forward(cfg_, cfg_.numerics(fmt, h), T, hs, q.data(), k.data(), v.data(), fw,
                     collect_stats_);
        scatter(o, static_cast<size_t>(C), b, h, T, hs, 0, fw.o.data());
        for (int t = 0; t < T; ++t) l[static_cast<size_t>(bh) * T + t] = static_cast<S>(fw.lse[t]);
      }
    }
    if (collect_stats_) {
      stats_.assign(NH, AttentionHeadStats{});
      for (int bh = 0; bh < B * NH; ++bh) {  // merged in a fixed order
        stats_[bh % NH].merge(saved_[bh].stats);
      }
    }
  }

  template <class S>
  void run_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, int NH,
                    DType fmt) {
    const int B = B_, T = T_, C = static_cast<int>(qkv.dim(2) / 3), hs = C / NH;
    const S* src = qkv.data<S>();
    const S* dsrc = dout.data<S>();
    S* dst = dqkv.data<S>();
    const size_t C3 = 3 * static_cast<size_t>(C);
#pragma omp parallel
    {
      const size_t n = static_cast<size_t>(T) * hs;
      std::vector<double> q(n), k(n), v(n), dO(n), dq(n), dk(n), dv(n);
#pragma omp for schedule(dynamic)
      for (int bh = 0; bh < B * NH; ++bh) {
        const int b = bh / NH, h = bh % NH;
        gather(src, b, h, T, C, hs, 0, q.data());
        gather(src, b, h, T, C, hs, 1, k.data());
        gather(src, b, h, T, C, hs, 2, v.data());
        for (int t = 0; t < T; ++t)
          for (int j = 0; j < hs; ++j)
            dO[t * hs + j] = dsrc[(static_cast<size_t>(b) * T + t) * C + h * hs + j];
        head_backward(cfg_, cfg_.numerics(fmt, h), T, hs, q.data(), k.data(), v.data(),
                      saved_[bh], dO.data(), dq.data(), dk.data(), dv.data());
        scatter(dst, C3, b, h, T, hs, 0, dq.data());
        scatter(dst, C3, b, h, T, hs, static_cast<size_t>(C), dk.data());
        scatter(dst, C3, b, h, T, hs, 2 * static_cast<size_t>(C), dv.data());
      }
    }
  }

  AttentionConfig cfg_;
  int64_t B_ = -1, T_ = -1;
  int NH_ = -1, HS_ = -1;
  DType fmt_ = DType::F32;
  bool fast_ = false;      // the last forward ran the fast path
  bool force_lab_;
  std::vector<HeadForward> saved_;  // (B * NH) forward results of the last call (lab)
  std::vector<float> fo_, fo32_, flse_, fP_;  // the same for the fast path
};

}  // namespace

std::unique_ptr<Attention> make_attention_cpu(const AttentionConfig& cfg, AttentionCpuPath path) {
  if (cfg.kind == AttentionKind::Cudnn)
    fail("attention.backend = cudnn runs only on an NVIDIA GPU (device: cuda): there is no CPU "
         "implementation of cuDNN's fused attention; use flash on the CPU (docs/numerics.md, "
         "\"cuDNN\", lists the settings nearest to it)");
  ST_CHECK(cfg.kind == AttentionKind::Baseline || (cfg.block_q >= 0 && cfg.block_k >= 0),
           "attention tiles must be >= 0 (0: one tile per row), got Br=", cfg.block_q,
           " Bc=", cfg.block_k);
  ST_CHECK(cfg.beta >= 1.0, "attention.beta must be >= 1, got ", cfg.beta);
  ST_CHECK(cfg.tie_tol >= 0.0, "attention.tie_tol must be >= 0, got ", cfg.tie_tol);
  return std::make_unique<AttentionCpu>(cfg, path);
}

void check_attention_args(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head) {
  ST_CHECK(qkv.ndim() == 3 && qkv.dim(2) % 3 == 0, "attention: qkv must be (B, T, 3C), got ",
           qkv.desc());
  const int64_t B = qkv.dim(0), Tn = qkv.dim(1), C = qkv.dim(2) / 3;
  ST_CHECK(n_head > 0 && C % n_head == 0, "attention: n_embd ", C,
           " is not divisible by n_head ", n_head);
  check_shape(out, {B, Tn, C}, "attention out");
  check_shape(lse, {B, n_head, Tn}, "attention lse");
  ST_CHECK(out.dtype() == qkv.dtype() && lse.dtype() == qkv.dtype(),
           "attention: dtypes differ: out ", out.desc(), ", lse ", lse.desc(), ", qkv ",
           qkv.desc());
}

}  // namespace st
