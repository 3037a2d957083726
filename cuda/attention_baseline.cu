// Baseline attention on the GPU: S and P materialised in the compute format f, as a PyTorch
// baseline does, with the rounding points of the CPU specification (attention/head_cpu.cpp:
// baseline_forward, head_deltas' baseline branch, head_backward with one tile of T x T).
//
// Layouts. qkv (B, T, 3C) packed, out (B, T, C), dqkv (B, T, 3C) in storage f; lse
// (B, NH, T) FP32. The heads are permuted into arena scratch, one row-major (T, hs) matrix
// per head, BH = B * NH heads one after another (head bh = b * NH + h):
//   Q, K, V, O, dO, dQ, dK, dV   (BH, T, hsp)   hsp = hs rounded up to 8 (leading dimension)
//   S, then P in place           (BH, T, Tp)    Tp = T rounded up to 8; row t = query t
//   dP, then dS in place         (BH, T, Tp)
// The padding keeps every row and every head 16-byte aligned for cuBLASLt; padded columns
// are never read (the GEMMs' k and m stop at hs and T).
// P is kept in the Attention object (one per layer) for the backward: BH * T * Tp elements
// of f, reallocated when B, T, NH or f change. Everything else is scratch of one call.
//
// Forward:
//   S  = round_f(fl32(scale * (Q K^T)))     batched GEMM, alpha = scale (see below)
//   per row t (kernel softmax_forward_kernel; the row is cached in shared memory when it
//   fits beside the static shared memory, T <= 12160, so S is read once), keys s < n (n = t + 1 causal, else T):
//     mx = max_s S; e_s = fl32(exp(S_s - mx)) (difference and exp in FP64, as the CPU);
//     sum = FP32 sum of e_s (fixed order: thread-strided partials, then block_sum's tree);
//     P_s = round_f(e_s / sum) (quotient in FP64, rounded once); P_s = 0 for s >= n;
//     lse = fl32(mx + log(sum)) (FP64 arithmetic)
//   O  = round_f(P V)                        batched GEMM
// Backward:
//   dP = round_f(dO V^T); dV = round_f(P^T dO)            batched GEMMs
//   per row t (softmax_backward_kernel): delta = FP32 sum of fmaf(dP_s, P_s) over s < n
//     (fixed order); dS_s = round_f(P_s * (dP_s - delta)) in FP64, rounded once; 0 for s >= n
//   dQ = round_f(fl32(scale * (dS K))); dK = round_f(fl32(scale * (dS^T Q)))
//
// Rounding against the CPU. The GEMMs accumulate in FP32 like the CPU's dot products, in
// another order (cuBLASLt's tiling, tensor cores for BF16/FP16): FP32 reassociation. The
// scale is applied as cuBLASLt's alpha, which gives round_f(fl32(scale * acc)); the CPU
// computes round_f(acc * scale) from the exact product (one rounding). The two differ only
// when fl32(scale * acc) lands exactly on a rounding boundary of f, and never when scale
// is a power of two (hs = 4, 16, 64, 256: the product is exact in FP32). With f = FP32 they
// are the same. The row kernels do the CPU's operations in the CPU's formats (FP64 where
// the CPU computes in double), so from equal S / dP they produce equal P / dS, except for
// the FP32 row sums (sum, delta), whose order differs. The masked (upper-triangle) part of
// S and dP is computed by the full T x T GEMMs and then ignored; P and dS are 0 there.
//
// Determinism: no atomics; the row sums have a fixed order, each GEMM shape a cached plan
// (matmul.cu), so repeated calls give bit-identical results.
//
// Statistics (collect_stats): the softmax kernel writes per row the row maximum of the
// stored S (max_logit), whether another key is within tie_tol of it (tied; the row is the
// baseline's one key tile, so tied_in_tile = tied_rows), the count of P entries equal to 1
// (p_one), the count of round(exp(S - max)) equal to 1 (p_tilde_one: what flash with one
// key tile per row counts as P~ == 1), and the row's softmax entropy computed from S in FP64
// (as the CPU's row_stats); the host merges rows in (b, h, t) order like the CPU backend.
//
// Supported: the gpu rounding rule with f in {bf16, fp16, fp32} and its defaults; overrides
// equal to those defaults; causal or not. Every other setting (every_op / every_mac,
// fp32_out_heads, another format at any point) is refused with an error naming the
// attention.* key: those run on the CPU backend (device: cpu).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/attention.h"
#include "cuda/attention_cuda.h"
#include "cuda/attention_softmax.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"

namespace st {
namespace {

int64_t round_up8(int64_t x) {
  return (x + 7) / 8 * 8;
}

// One strided-batched GEMM over the BH heads, column-major terms (matmul.cu).
struct Operand {
  const void* p;
  int64_t ld, stride;
};
void head_gemm(CudaBackend& be, DType dtype, int64_t heads, bool transa, bool transb, int64_t m,
               int64_t n, int64_t k, Operand A, Operand B, void* D, int64_t ldd, int64_t stride_d,
               float alpha) {
  GemmOp g;
  g.transa = transa;
  g.transb = transb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.A = A.p;
  g.lda = A.ld;
  g.stride_a = A.stride;
  g.B = B.p;
  g.ldb = B.ld;
  g.stride_b = B.stride;
  g.D = D;
  g.ldd = ldd;
  g.stride_d = stride_d;
  g.alpha = alpha;
  g.dtype = dtype;
  g.batch = heads;
  be.gemm().matmul(g, be.stream());
}

// ---- configuration checks

[[noreturn]] void unsupported(const std::string& what) {
  fail("CUDA baseline attention: ", what,
       " is not implemented on the GPU; this setting runs on device: cpu");
}

// What does not depend on the compute format (checked when the layer is made).
void check_config(const AttentionConfig& cfg) {
  ST_CHECK(cfg.kind == AttentionKind::Baseline, "make_attention_cuda_baseline: attention.backend ",
           attention_kind_name(cfg.kind));
  if (cfg.rule != RoundingRule::Gpu)
    unsupported(std::string("attention.rule = ") + rounding_rule_name(cfg.rule) + " (only gpu)");
  // The GPU's wide format is FP32 whatever f is.
  if (cfg.accum && *cfg.accum != DType::F32)
    unsupported(std::string("attention.accum = ") + dtype_name(*cfg.accum) + " (only fp32)");
  if (cfg.mac && *cfg.mac != DType::F32)
    unsupported(std::string("attention.mac = ") + dtype_name(*cfg.mac) + " (only fp32)");
  ST_CHECK(cfg.tie_tol >= 0.0, "attention.tie_tol must be >= 0, got ", cfg.tie_tol);
}

// Every head's resolved formats must be the gpu rule's defaults for f.
void check_numerics(const AttentionConfig& cfg, DType f, int NH) {
  check_config(cfg);
  const AttnNumerics want = numerics_for_rule(RoundingRule::Gpu, f, false);
  for (int h = 0; h < NH; ++h) {
    const AttnNumerics n = cfg.numerics(f, h);
    const auto point = [&](const char* key, DType got, DType gpu) {
      if (got == gpu) return;
      unsupported(std::string("attention.") + key + " = " + dtype_name(got) + " with " +
                  dtype_name(f) + " compute (the gpu rule's " + key + " is " + dtype_name(gpu) +
                  ")");
    };
    if (n.out != want.out) {
      for (int listed : cfg.fp32_out_heads)
        if (listed == h)
          unsupported("attention.fp32_out_heads (head " + std::to_string(h) +
                      ": FP32 stored O with " + dtype_name(f) + " compute)");
    }
    point("qkv", n.qkv, want.qkv);
    point("scores", n.scores, want.scores);
    point("probs", n.probs, want.probs);
    point("accum", n.accum, want.accum);
    point("out", n.out, want.out);
    point("mac", n.mac, want.mac);
    point("lsum", n.lsum, want.lsum);
    point("lsum_mac", n.lsum_mac, want.lsum_mac);
    point("grads", n.grads, want.grads);
    if (n.round_ops != want.round_ops) unsupported("attention.rule (rounding of every op)");
  }
}

void check_device(const Tensor& t, DType dtype, const char* what) {
  ST_CHECK(t.defined(), "CUDA baseline attention: ", what, " is undefined");
  ST_CHECK(t.device() == Device::CUDA, "CUDA baseline attention: ", what, " ", t.desc(),
           " must be on the GPU");
  ST_CHECK(t.dtype() == dtype, "CUDA baseline attention: ", what, " ", t.desc(),
           " must have storage ", dtype_name(dtype));
}

int to_int(int64_t v, const char* what) {
  ST_CHECK(v >= 0 && v <= INT32_MAX, "CUDA baseline attention: ", what, " = ", v,
           " does not fit in int");
  return static_cast<int>(v);
}

// ---- the Attention object of one layer

class AttentionCudaBaseline final : public Attention {
 public:
  AttentionCudaBaseline(CudaBackend& be, const AttentionConfig& cfg)
      : Attention(cfg.collect_stats), be_(be), cfg_(cfg) {
    check_config(cfg_);
  }

  std::string name() const override { return attention_kind_name(cfg_.kind); }

  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head,
               DType fmt) override {
    const Dims d = dims(qkv, n_head, fmt);
    check_device(out, d.f, "out");
    check_device(lse, DType::F32, "lse");
    check_shape(out, {d.B, d.T, d.C}, "attention out");
    check_shape(lse, {d.B, n_head, d.T}, "attention lse");
    check_numerics(cfg_, fmt, n_head);
    B_ = d.B, T_ = d.T, NH_ = d.NH, fmt_ = fmt;
    if (collect_stats_) stats_.assign(d.NH, AttentionHeadStats{});
    const int64_t rows = d.BH * d.T;
    if (rows == 0) {
      P_ = Tensor();
      return;
    }
    if (!P_.defined() || P_.dtype() != d.f || P_.shape() != Shape{d.BH, d.T, d.Tp})
      P_ = Tensor();  // released first, so the arena can hand the block out again
    if (!P_.defined()) P_ = be_.alloc({d.BH, d.T, d.Tp}, d.f);
    cudaStream_t stream = be_.stream();

    Tensor q = be_.alloc({d.BH, d.T, d.hsp}, d.f), k = be_.alloc({d.BH, d.T, d.hsp}, d.f);
    Tensor v = be_.alloc({d.BH, d.T, d.hsp}, d.f);
    const int64_t C3 = 3 * d.C;
    cudak::attn_split_heads(q.raw(), qkv.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, 0, d.f, stream);
    cudak::attn_split_heads(k.raw(), qkv.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, d.C, d.f, stream);
    cudak::attn_split_heads(v.raw(), qkv.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, 2 * d.C, d.f,
                            stream);

    // S (BH, T, Tp), row t = query t. Column-major: S^T (T_s x T_t) = K . Q^T per head:
    // A = K stored (hs, T) ld hsp, op T; B = Q stored (hs, T) ld hsp, op N.
    const int64_t sq = d.T * d.hsp, ss = d.T * d.Tp;
    head_gemm(be_, d.f, d.BH, true, false, d.T, d.T, d.hs, {k.raw(), d.hsp, sq},
              {q.raw(), d.hsp, sq}, P_.raw(), d.Tp, ss, scale(d.hs));

    cudak::SoftmaxRowStats st;
    Tensor st_buf;
    if (collect_stats_) {  // doubles first (8-byte aligned), then float, int, int, int
      st_buf = be_.alloc({6 * rows}, DType::F32);
      float* base = static_cast<float*>(st_buf.raw());
      st.entropy = reinterpret_cast<double*>(base);
      st.max_logit = base + 2 * rows;
      st.tied = reinterpret_cast<int*>(base + 3 * rows);
      st.p_one = reinterpret_cast<int*>(base + 4 * rows);
      st.p_tilde_one = reinterpret_cast<int*>(base + 5 * rows);
    }
    cudak::softmax_forward(P_.raw(), static_cast<float*>(lse.raw()), rows, d.T, d.Tp, cfg_.causal,
                           st, cfg_.tie_tol, d.f, stream);

    // O (BH, T, hsp). Column-major: O^T (hs x T_t) = V^T (hs x T_s) . P^T (T_s x T_t):
    // A = V stored (hs, T) ld hsp, op N; B = P stored (T_s, T_t) ld Tp, op N.
    Tensor o = be_.alloc({d.BH, d.T, d.hsp}, d.f);
    head_gemm(be_, d.f, d.BH, false, false, d.hs, d.T, d.T, {v.raw(), d.hsp, sq},
              {P_.raw(), d.Tp, ss}, o.raw(), d.hsp, sq, 1.0f);
    cudak::attn_merge_heads(out.raw(), o.raw(), d.B, d.T, d.NH, d.hs, d.hsp, d.C, 0, d.f, stream);

    if (collect_stats_) merge_stats(st_buf, d);
  }

  void backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                const Tensor& lse, int n_head, DType fmt) override {
    const Dims d = dims(qkv, n_head, fmt);
    check_device(dqkv, d.f, "dqkv");
    check_device(dout, d.f, "dout");
    check_shape(dqkv, qkv.shape(), "attention dqkv");
    check_shape(dout, {d.B, d.T, d.C}, "attention dout");
    ST_CHECK(B_ == d.B && T_ == d.T && NH_ == d.NH && fmt_ == fmt,
             "CUDA baseline attention: backward called without a matching forward (forward B=", B_,
             " T=", T_, " NH=", NH_, ", backward B=", d.B, " T=", d.T, " NH=", d.NH, ")");
    const int64_t rows = d.BH * d.T;
    if (rows == 0) return;
    ST_CHECK(P_.defined(), "CUDA baseline attention: no saved P");
    cudaStream_t stream = be_.stream();

    const int64_t C3 = 3 * d.C, sq = d.T * d.hsp, ss = d.T * d.Tp;
    Tensor q = be_.alloc({d.BH, d.T, d.hsp}, d.f), k = be_.alloc({d.BH, d.T, d.hsp}, d.f);
    Tensor v = be_.alloc({d.BH, d.T, d.hsp}, d.f), dO = be_.alloc({d.BH, d.T, d.hsp}, d.f);
    cudak::attn_split_heads(q.raw(), qkv.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, 0, d.f, stream);
    cudak::attn_split_heads(k.raw(), qkv.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, d.C, d.f, stream);
    cudak::attn_split_heads(v.raw(), qkv.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, 2 * d.C, d.f,
                            stream);
    cudak::attn_split_heads(dO.raw(), dout.raw(), d.B, d.T, d.NH, d.hs, d.hsp, d.C, 0, d.f, stream);

    // dP (BH, T, Tp) = dO V^T, as S = Q K^T: A = V (op T), B = dO (op N).
    Tensor dP = be_.alloc({d.BH, d.T, d.Tp}, d.f);
    head_gemm(be_, d.f, d.BH, true, false, d.T, d.T, d.hs, {v.raw(), d.hsp, sq},
              {dO.raw(), d.hsp, sq}, dP.raw(), d.Tp, ss, 1.0f);
    // dV (T_s, hs) = P^T dO. Column-major: dV^T (hs x T_s) = dO^T (hs x T_t) . P (T_t x T_s):
    // A = dO stored (hs, T) ld hsp, op N; B = P stored (T_s, T_t) ld Tp, op T.
    Tensor dv = be_.alloc({d.BH, d.T, d.hsp}, d.f);
    head_gemm(be_, d.f, d.BH, false, true, d.hs, d.T, d.T, {dO.raw(), d.hsp, sq},
              {P_.raw(), d.Tp, ss}, dv.raw(), d.hsp, sq, 1.0f);

    cudak::softmax_backward(dP.raw(), P_.raw(), rows, d.T, d.Tp, cfg_.causal, d.f, stream);
    const Tensor& dS = dP;

    // dQ (T_t, hs) = scale dS K, as O = P V: A = K stored (hs, T) op N; B = dS stored
    // (T_s, T_t) ld Tp, op N.
    Tensor dq = be_.alloc({d.BH, d.T, d.hsp}, d.f);
    head_gemm(be_, d.f, d.BH, false, false, d.hs, d.T, d.T, {k.raw(), d.hsp, sq},
              {dS.raw(), d.Tp, ss}, dq.raw(), d.hsp, sq, scale(d.hs));
    // dK (T_s, hs) = scale dS^T Q, as dV = P^T dO: A = Q (op N); B = dS (op T).
    Tensor dk = be_.alloc({d.BH, d.T, d.hsp}, d.f);
    head_gemm(be_, d.f, d.BH, false, true, d.hs, d.T, d.T, {q.raw(), d.hsp, sq},
              {dS.raw(), d.Tp, ss}, dk.raw(), d.hsp, sq, scale(d.hs));

    cudak::attn_merge_heads(dqkv.raw(), dq.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, 0, d.f, stream);
    cudak::attn_merge_heads(dqkv.raw(), dk.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, d.C, d.f,
                            stream);
    cudak::attn_merge_heads(dqkv.raw(), dv.raw(), d.B, d.T, d.NH, d.hs, d.hsp, C3, 2 * d.C, d.f,
                            stream);
  }

 private:
  struct Dims {
    DType f;
    int B, T, NH, hs;
    int64_t C, BH, hsp, Tp;
  };

  Dims dims(const Tensor& qkv, int n_head, DType fmt) const {
    const DType f = be_.storage_dtype(fmt);  // fp64 refused here
    check_device(qkv, f, "qkv");
    ST_CHECK(qkv.ndim() == 3 && qkv.dim(2) % 3 == 0,
             "CUDA baseline attention: qkv must be (B, T, 3C), got ", qkv.desc());
    const int64_t C = qkv.dim(2) / 3;
    ST_CHECK(n_head > 0 && C % n_head == 0, "CUDA baseline attention: n_embd ", C,
             " is not divisible by n_head ", n_head);
    Dims d;
    d.f = f;
    d.B = to_int(qkv.dim(0), "B");
    d.T = to_int(qkv.dim(1), "T");
    d.NH = n_head;
    d.hs = to_int(C / n_head, "head size");
    d.C = C;
    d.BH = static_cast<int64_t>(d.B) * n_head;
    d.hsp = round_up8(d.hs);
    d.Tp = round_up8(d.T);
    ST_CHECK(d.BH * d.T <= INT32_MAX, "CUDA baseline attention: B * n_head * T = ", d.BH * d.T,
             " rows exceed the grid");
    return d;
  }

  // 1/sqrt(hs) as the CPU holds it: rounded to FP32.
  static float scale(int hs) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  }

  // Per-row statistics to the host (waits for the stream), merged like the CPU backend:
  // rows of one (b, h) in t order, then (b, h) in order into head h.
  void merge_stats(const Tensor& st_buf, const Dims& d) {
    const int64_t rows = d.BH * d.T;
    Tensor host = Tensor::empty({6 * rows}, DType::F32);
    be_.copy(host, st_buf);
    const auto* base = static_cast<const char*>(host.raw());
    std::vector<double> ent(rows);
    std::vector<float> mx(rows);
    std::vector<int> tied(rows), ones(rows), tilde_ones(rows);
    std::memcpy(ent.data(), base, rows * sizeof(double));
    std::memcpy(mx.data(), base + 8 * rows, rows * sizeof(float));
    std::memcpy(tied.data(), base + 12 * rows, rows * sizeof(int));
    std::memcpy(ones.data(), base + 16 * rows, rows * sizeof(int));
    std::memcpy(tilde_ones.data(), base + 20 * rows, rows * sizeof(int));
    for (int64_t bh = 0; bh < d.BH; ++bh) {
      AttentionHeadStats s;
      for (int64_t r = bh * d.T; r < (bh + 1) * d.T; ++r)  // the row is baseline's one key tile
        s.add_row(mx[r], tied[r] != 0, tied[r] != 0, ones[r], tilde_ones[r], ent[r]);
      stats_[bh % d.NH].merge(s);
    }
  }

  CudaBackend& be_;
  AttentionConfig cfg_;
  Tensor P_;  // (BH, T, Tp) in f: the last forward's probabilities
  int64_t B_ = -1, T_ = -1;
  int NH_ = -1;
  DType fmt_ = DType::F32;
};

}  // namespace

std::unique_ptr<Attention> make_attention_cuda_baseline(CudaBackend& be,
                                                        const AttentionConfig& cfg) {
  return std::make_unique<AttentionCudaBaseline>(be, cfg);
}

}  // namespace st
