// Baseline attention on the CPU: scores S and probabilities P materialised, as a
// PyTorch/cuBLAS implementation in the compute format stores them.
// Rounding points (fmt = compute format; matmul-like sums accumulate in T = FP32):
//   S = round(scale * q.k)            (GEMM with alpha = scale)
//   P = round(exp(S - max) / sum)     (softmax in FP32 from the rounded S); lse = max + log sum
//   O = round(P.V)
// Backward (standard; O is not involved):
//   dP = round(dO.V^T); dS = round(P * (dP - rowsum(P*dP)))
//   dQ = round(scale * dS.K); dK = round(scale * dS^T.Q); dV = round(P^T.dO)
// P is kept per layer between forward and backward.
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_cpu.h"
#include "core/error.h"

namespace st {
namespace {

template <class T>
void baseline_forward(T* out, T* lse, T* P, const T* qkv, int B, int Tn, int C, int NH,
                      DType fmt) {
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(T(hs));
  const size_t C3 = 3 * static_cast<size_t>(C);
#pragma omp parallel
  {
    std::vector<T> S(Tn);
#pragma omp for schedule(static) collapse(2)
    for (int bh = 0; bh < B * NH; ++bh) {
      for (int t = 0; t < Tn; ++t) {
        const int b = bh / NH, h = bh % NH;
        const T* base = qkv + static_cast<size_t>(b) * Tn * C3;
        const T* q = base + t * C3 + h * hs;
        T mx = -std::numeric_limits<T>::infinity();
        for (int s = 0; s <= t; ++s) {
          const T* k = base + s * C3 + C + h * hs;
          T dot = 0;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          S[s] = round_to(fmt, scale * dot);
          mx = S[s] > mx ? S[s] : mx;
        }
        T sum = 0;
        for (int s = 0; s <= t; ++s) sum += std::exp(S[s] - mx);
        const T inv = T(1) / sum;
        T* p = P + (static_cast<size_t>(bh) * Tn + t) * Tn;
        for (int s = 0; s <= t; ++s) p[s] = round_to(fmt, std::exp(S[s] - mx) * inv);
        for (int s = t + 1; s < Tn; ++s) p[s] = 0;
        lse[static_cast<size_t>(bh) * Tn + t] = mx + std::log(sum);
        T* o = out + (static_cast<size_t>(b) * Tn + t) * C + h * hs;
        for (int d = 0; d < hs; ++d) o[d] = 0;
        for (int s = 0; s <= t; ++s) {
          const T* v = base + s * C3 + 2 * C + h * hs;
          for (int d = 0; d < hs; ++d) o[d] += p[s] * v[d];
        }
        for (int d = 0; d < hs; ++d) o[d] = round_to(fmt, o[d]);
      }
    }
  }
}

template <class T>
void baseline_backward(T* dqkv, const T* dout, const T* qkv, const T* P, int B, int Tn, int C,
                       int NH, DType fmt) {
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(T(hs));
  const size_t C3 = 3 * static_cast<size_t>(C);
#pragma omp parallel
  {
    std::vector<T> dS(static_cast<size_t>(Tn) * Tn);
    std::vector<T> acc(static_cast<size_t>(Tn) * hs);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const T* base = qkv + static_cast<size_t>(b) * Tn * C3;
      T* dbase = dqkv + static_cast<size_t>(b) * Tn * C3;
      const T* dob = dout + static_cast<size_t>(b) * Tn * C;
      const T* Pb = P + static_cast<size_t>(bh) * Tn * Tn;
      // dP, then dS in place, row by row.
      for (int t = 0; t < Tn; ++t) {
        const T* dot = dob + static_cast<size_t>(t) * C + h * hs;
        const T* p = Pb + static_cast<size_t>(t) * Tn;
        T* ds = dS.data() + static_cast<size_t>(t) * Tn;
        T rowsum = 0;
        for (int s = 0; s <= t; ++s) {
          const T* v = base + s * C3 + 2 * C + h * hs;
          T a = 0;
          for (int d = 0; d < hs; ++d) a += dot[d] * v[d];
          ds[s] = round_to(fmt, a);  // dP
          rowsum += p[s] * ds[s];
        }
        for (int s = 0; s <= t; ++s) ds[s] = round_to(fmt, p[s] * (ds[s] - rowsum));
      }
      // dQ[t] = scale * sum_s dS[t,s] k[s]
      for (int t = 0; t < Tn; ++t) {
        const T* ds = dS.data() + static_cast<size_t>(t) * Tn;
        T* a = acc.data() + static_cast<size_t>(t) * hs;
        for (int d = 0; d < hs; ++d) a[d] = 0;
        for (int s = 0; s <= t; ++s) {
          const T* k = base + s * C3 + C + h * hs;
          for (int d = 0; d < hs; ++d) a[d] += ds[s] * k[d];
        }
        T* dq = dbase + t * C3 + h * hs;
        for (int d = 0; d < hs; ++d) dq[d] = round_to(fmt, scale * a[d]);
      }
      // dK[s] = scale * sum_t dS[t,s] q[t];  dV[s] = sum_t P[t,s] dO[t]
      for (int s = 0; s < Tn; ++s) {
        T* ak = acc.data() + static_cast<size_t>(s) * hs;
        for (int d = 0; d < hs; ++d) ak[d] = 0;
        for (int t = s; t < Tn; ++t) {
          const T* q = base + t * C3 + h * hs;
          const T w = dS[static_cast<size_t>(t) * Tn + s];
          for (int d = 0; d < hs; ++d) ak[d] += w * q[d];
        }
        T* dk = dbase + s * C3 + C + h * hs;
        for (int d = 0; d < hs; ++d) dk[d] = round_to(fmt, scale * ak[d]);
        for (int d = 0; d < hs; ++d) ak[d] = 0;
        for (int t = s; t < Tn; ++t) {
          const T* dot = dob + static_cast<size_t>(t) * C + h * hs;
          const T w = Pb[static_cast<size_t>(t) * Tn + s];
          for (int d = 0; d < hs; ++d) ak[d] += w * dot[d];
        }
        T* dv = dbase + s * C3 + 2 * C + h * hs;
        for (int d = 0; d < hs; ++d) dv[d] = round_to(fmt, ak[d]);
      }
    }
  }
}

class BaselineAttentionCpu : public Attention {
 public:
  std::string name() const override { return "baseline"; }

  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head,
               DType fmt) override {
    const int B = static_cast<int>(qkv.dim(0)), Tn = static_cast<int>(qkv.dim(1));
    const int C = static_cast<int>(qkv.dim(2) / 3);
    check_attention_args(out, lse, qkv, n_head);
    const Shape pshape{B, n_head, Tn, Tn};
    if (!P_.defined() || P_.shape() != pshape || P_.dtype() != qkv.dtype())
      P_ = Tensor::empty(pshape, qkv.dtype());
    if (qkv.dtype() == DType::F64)
      baseline_forward(out.data<double>(), lse.data<double>(), P_.data<double>(),
                       qkv.data<double>(), B, Tn, C, n_head, fmt);
    else
      baseline_forward(out.data<float>(), lse.data<float>(), P_.data<float>(),
                       qkv.data<float>(), B, Tn, C, n_head, fmt);
  }

  void backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                const Tensor& lse, int n_head, DType fmt) override {
    check_attention_args(out, lse, qkv, n_head);
    check_same(dqkv, qkv, "attention backward: dqkv vs qkv");
    check_same(dout, out, "attention backward: dout vs out");
    const int B = static_cast<int>(qkv.dim(0)), Tn = static_cast<int>(qkv.dim(1));
    const int C = static_cast<int>(qkv.dim(2) / 3);
    ST_CHECK(P_.defined() && P_.shape() == (Shape{B, n_head, Tn, Tn}),
             "attention backward called without a matching forward");
    if (qkv.dtype() == DType::F64)
      baseline_backward(dqkv.data<double>(), dout.data<double>(), qkv.data<double>(),
                        P_.data<double>(), B, Tn, C, n_head, fmt);
    else
      baseline_backward(dqkv.data<float>(), dout.data<float>(), qkv.data<float>(),
                        P_.data<float>(), B, Tn, C, n_head, fmt);
  }

 private:
  Tensor P_;  // (B, NH, T, T) probabilities from the last forward
};

}  // namespace

std::unique_ptr<Attention> make_attention_cpu(const AttentionConfig& cfg) {
  switch (cfg.kind) {
    case AttentionKind::Baseline: return std::make_unique<BaselineAttentionCpu>();
    case AttentionKind::Flash:
    case AttentionKind::StabilizedFlash:
      fail("attention backend '", attention_kind_name(cfg.kind),
           "' is not implemented yet (it comes with the attention issue); use 'baseline'");
  }
  fail("unknown attention kind");
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
