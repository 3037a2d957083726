// The CUDA flash and stabilized-flash attention (AttentionKind::Flash / StabilizedFlash): the
// Attention class over the kernels of flash_fwd.cuh (forward), flash_bwd.cuh (dK/dV, dQ and
// the dp_p delta pass) and flash_aux.cu (delta from O, per-row statistics).
//
// What it implements, checked against the configuration here (any other setting throws a
// one-line error naming the attention.* key; the GPU never silently does something else):
//   compute format  bf16 or fp16 (Q, K, V, P~, O and the gradients are stored in it)
//   rule            gpu; attention.scores fp32 | compute format; attention.accum fp32 |
//                   compute format (the paper's low-precision O~ accumulator);
//                   attention.mac fp32; qkv/probs/out/grads = the compute format
//   tiles           (block_q, block_k) in flash::kFwdTilesText (forward); the backward's
//                   own tiles only need block_q, block_k multiples of 64 in accum-low mode
//   delta           o | o_split | o_fp32 | dp_p  (fp32_recompute: CPU only)
//   O~ amplifier    o_tilde_bits or o_tilde_gain, o_tilde_scope all | tied, mma_sync kernels
//                   (untied_matched and tie_break: CPU only)
//   head size       64 or 128; any T >= 1, any B * NH
// Each object belongs to one layer and keeps, between forward and backward, what the delta
// mode needs (o_fp32: O in FP32; o_split: the residual tensor) plus the delta row buffer,
// all from the backend's arena, reallocated when B, T, NH or the format change.
// Statistics (collect_stats): p_tilde_one is counted by the forward kernel itself (the P~ it
// really used); p_one (the normalised P == 1) is derived on the host from each row's lse and
// maximum (flash::merge_row_stats); the other fields come from a separate per-row kernel
// that reproduces the CPU's scores exactly. Per-row values are merged on the host in a fixed
// order (per (b, h), rows in order; then heads over b), as the CPU backend does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention/head_cpu.h"
#include "core/error.h"
#include "cuda/attention_cuda.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/flash_attention.h"
#include "cuda/flash_launch.cuh"
#include "cuda/flash_plan.h"

namespace st {
namespace {

const char* fmt_name(DType t) { return dtype_name(t); }

// align: 16 for the tensors read with 16-byte copies; 4 for lse (a layer's view of the
// model's (L, B, NH, T) buffer), read and written one float at a time.
void check_gpu(const Tensor& t, DType dtype, const char* what, size_t align = 16) {
  check_device_tensor(t, dtype, "flash attention", what, align);
}

class FlashAttentionCuda : public Attention {
 public:
  FlashAttentionCuda(CudaBackend& be, const AttentionConfig& cfg)
      : Attention(cfg.collect_stats), be_(be), cfg_(cfg) {
    ST_CHECK(cfg.kind == AttentionKind::Flash || cfg.kind == AttentionKind::StabilizedFlash,
             "make_attention_cuda_flash: attention kind ", attention_kind_name(cfg.kind));
    if (cfg.block_q == 0 || cfg.block_k == 0)
      fail("attention.block_q = ", cfg.block_q, ", attention.block_k = ", cfg.block_k,
           ": one tile per row (0) is CPU only; the CUDA flash kernels support (block_q, "
           "block_k) = ",
           flash::kFwdTilesText);
    if (!flash::fwd_tiles_supported(cfg.block_q, cfg.block_k))
      fail("attention.block_q = ", cfg.block_q, ", attention.block_k = ", cfg.block_k,
           " is not supported by the CUDA flash kernels (supported (block_q, block_k): ",
           flash::kFwdTilesText, ")");
    if (cfg.cuda_kernel == FlashKernel::Sm90) {
      int major = 0, minor = 0;
      ST_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                           be.device_index()));
      ST_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                                           be.device_index()));
      if (major != 9 || minor != 0)
        fail("attention.cuda_kernel = sm90 needs a Hopper GPU (compute capability 9.0; this is ",
             major, ".", minor, "): use attention.cuda_kernel: mma_sync");
      flash::check_kernel_tiles(cfg);
    }
    if (cfg.rule != RoundingRule::Gpu)
      fail("attention.rule = ", rounding_rule_name(cfg.rule),
           " is CPU only (the CUDA flash kernels implement rule gpu, with the attention.scores "
           "and attention.accum overrides)");
    if (!cfg.fp32_out_heads.empty())
      fail("attention.fp32_out_heads is not supported by the CUDA flash kernels; use "
           "attention.delta: o_fp32 (the backward's delta from the forward's FP32 O) instead");
    // o_tilde_bits / o_tilde_gain with o_tilde_scope all or tied: the amplifier kernels
    // (flash_fwd_amp_*.cu); untied_matched, tie_break and sm90 with an amplifier are refused.
    flash::check_amplifier(cfg);
    if (cfg.delta == DeltaMode::Fp32Recompute)
      fail("attention.delta = fp32_recompute is CPU only; the CUDA flash kernels support o, "
           "o_split, o_fp32 and dp_p");
    if (cfg.mac && *cfg.mac != DType::F32)
      fail("attention.mac = ", fmt_name(*cfg.mac),
           " is not supported by the CUDA flash kernels (the tensor cores accumulate in fp32)");
    if (cfg.kind == AttentionKind::StabilizedFlash && cfg.tie_shift != TieShift::Beta)
      fail("attention.tie_shift = ", tie_shift_name(cfg.tie_shift),
           " is CPU only; the CUDA stabilized flash kernels shift by beta");
    // The kernels keep l in O~'s format (FP32, or the low format with attention.accum low).
    if (cfg.lsum && *cfg.lsum != cfg.accum.value_or(DType::F32))
      fail("attention.lsum = ", fmt_name(*cfg.lsum), " differs from attention.accum = ",
           fmt_name(cfg.accum.value_or(DType::F32)),
           ": the CUDA flash kernels keep l in the accumulator's format; a separate l format "
           "runs on device: cpu");
    if (cfg.lsum_mac && *cfg.lsum_mac != DType::F32)
      fail("attention.lsum_mac = ", fmt_name(*cfg.lsum_mac),
           " is not supported by the CUDA flash kernels (row sums accumulate in fp32)");
    ST_CHECK(cfg.beta >= 1.0, "attention.beta must be >= 1, got ", cfg.beta);
    ST_CHECK(cfg.tie_tol >= 0.0, "attention.tie_tol must be >= 0, got ", cfg.tie_tol);
    ST_CHECK(cfg.max_shift >= 0.0, "attention.max_shift must be >= 0, got ", cfg.max_shift);
  }

  std::string name() const override { return attention_kind_name(cfg_.kind); }

  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head,
               DType fmt) override {
    const AttnNumerics n = resolve(fmt);
    const Dims d = dims(qkv, n_head);
    check_gpu(qkv, fmt, "qkv");
    check_gpu(out, fmt, "out");
    check_gpu(lse, DType::F32, "lse", 4);
    check_shape(out, {d.B, d.T, d.C}, "flash attention out");
    check_shape(lse, {d.B, n_head, d.T}, "flash attention lse");
    ST_CHECK(!overlaps(out, qkv) && !overlaps(lse, qkv) && !overlaps(out, lse),
             "flash attention: out ", out.desc(), " / lse ", lse.desc(), " overlap qkv ",
             qkv.desc(), " or each other");
    ensure_buffers(d, n, fmt);

    flash::Buffers b;
    b.qkv = qkv.raw();
    b.out = out.raw();
    b.lse = static_cast<float*>(lse.raw());
    b.saved = o_saved_.defined() ? o_saved_.raw() : nullptr;
    b.p_tilde_one = collect_stats_ ? static_cast<int32_t*>(ptilde_.raw()) : nullptr;
    flash::run_forward(cfg_, n, fmt, call_dims(d), b, be_.stream());
    B_ = d.B, T_ = d.T, NH_ = n_head, fmt_ = fmt;
    fwd_delta_ = n.delta;
    have_forward_ = true;
    if (collect_stats_) collect_stats(qkv, lse, d, n);
  }

  void backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                const Tensor& lse, int n_head, DType fmt) override {
    const AttnNumerics n = resolve(fmt);
    const Dims d = dims(qkv, n_head);
    check_gpu(qkv, fmt, "qkv");
    check_gpu(out, fmt, "out");
    check_gpu(dout, fmt, "dout");
    check_gpu(dqkv, fmt, "dqkv");
    check_gpu(lse, DType::F32, "lse", 4);
    check_shape(dqkv, qkv.shape(), "flash attention dqkv");
    check_shape(out, {d.B, d.T, d.C}, "flash attention out");
    check_shape(dout, {d.B, d.T, d.C}, "flash attention dout");
    check_shape(lse, {d.B, n_head, d.T}, "flash attention lse");
    for (const Tensor* t : {&qkv, &out, &dout, &lse})
      ST_CHECK(!overlaps(dqkv, *t), "flash attention backward: dqkv ", dqkv.desc(),
               " overlaps an input ", t->desc());
    ST_CHECK(have_forward_ && B_ == d.B && T_ == d.T && NH_ == n_head && fmt_ == fmt &&
                 fwd_delta_ == n.delta,
             "flash attention backward called without a matching forward");

    flash::Buffers b;
    b.qkv = qkv.raw();
    b.out = out.raw();
    b.lse = static_cast<float*>(lse.raw());
    b.saved = o_saved_.defined() ? o_saved_.raw() : nullptr;
    b.dout = dout.raw();
    b.delta = static_cast<float*>(delta_.raw());
    b.dqkv = dqkv.raw();
    flash::run_backward(cfg_, n, fmt, call_dims(d), b, be_.stream());
    have_delta_ = true;
  }

  std::vector<float> last_delta() {
    if (!have_delta_) return {};
    return to_host(delta_);
  }
  std::vector<float> saved_o() {
    if (!have_forward_ || !o_saved_.defined()) return {};
    return to_host(o_saved_);
  }

 private:
  struct Dims {
    int64_t B, T, C;
    int hs;
  };

  flash::CallDims call_dims(const Dims& d) const {
    return flash::CallDims{static_cast<int>(d.B), static_cast<int>(d.T),
                           static_cast<int>(NH_of(d)), d.hs};
  }

  Dims dims(const Tensor& qkv, int n_head) const {
    ST_CHECK(qkv.defined() && qkv.ndim() == 3 && qkv.dim(2) % 3 == 0,
             "flash attention: qkv must be (B, T, 3C), got ", qkv.defined() ? qkv.desc() : "undefined");
    const int64_t C = qkv.dim(2) / 3;
    ST_CHECK(n_head > 0 && C % n_head == 0, "flash attention: n_embd ", C,
             " is not divisible by n_head ", n_head);
    Dims d{qkv.dim(0), qkv.dim(1), C, static_cast<int>(C / n_head)};
    ST_CHECK(d.hs == 64 || d.hs == 128, "flash attention (CUDA): head size ", d.hs,
             " (n_embd / n_head) is not supported (64 or 128)");
    ST_CHECK(d.B > 0 && d.T > 0, "flash attention: empty batch ", qkv.desc());
    ST_CHECK(d.B * n_head <= INT32_MAX && d.B * d.T * 3 * C <= (int64_t{1} << 40),
             "flash attention: problem too large ", qkv.desc());
    return d;
  }

  // The formats of this call, checked against what the kernels implement.
  AttnNumerics resolve(DType fmt) const { return flash::resolve_numerics(cfg_, fmt); }

  void ensure_buffers(const Dims& d, const AttnNumerics& n, DType fmt) {
    const int64_t rows = d.B * NH_of(d) * d.T;
    if (!delta_.defined() || delta_.numel() != rows) delta_ = be_.alloc({rows}, DType::F32);
    if (n.delta == DeltaMode::OFp32 || n.delta == DeltaMode::OSplit) {
      const DType st = n.delta == DeltaMode::OFp32 ? DType::F32 : fmt;
      const Shape sh{d.B, d.T, d.C};
      if (!o_saved_.defined() || o_saved_.shape() != sh || o_saved_.dtype() != st)
        o_saved_ = be_.alloc(sh, st);
    } else {
      o_saved_ = Tensor();
    }
    if (collect_stats_) {
      if (!ptilde_.defined() || ptilde_.numel() != rows) {
        ptilde_ = be_.alloc({rows}, DType::I32);
        rowstats_ = be_.alloc({rows * 4}, DType::F32);  // 16-byte flash::RowStats per row
      }
    }
    have_delta_ = false;
  }
  int64_t NH_of(const Dims& d) const { return d.C / d.hs; }

  void collect_stats(const Tensor& qkv, const Tensor& lse, const Dims& d, const AttnNumerics& n) {
    static_assert(sizeof(flash::RowStats) == 16, "RowStats is 4 floats");
    const int NH = static_cast<int>(NH_of(d));
    flash::run_row_stats(cfg_, n, qkv.dtype(), call_dims(d), qkv.raw(),
                         static_cast<flash::RowStats*>(rowstats_.raw()), be_.stream());
    const size_t rows = static_cast<size_t>(d.B) * NH * d.T;
    std::vector<int32_t> ptilde(rows);
    std::vector<float> lse_h(rows);  // (B, NH, T), the rows' order: p_one from lse
    std::vector<flash::RowStats> rs(rows);
    ST_CUDA_CHECK(cudaMemcpyAsync(ptilde.data(), ptilde_.raw(), rows * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, be_.stream()));
    ST_CUDA_CHECK(cudaMemcpyAsync(lse_h.data(), lse.raw(), rows * sizeof(float),
                                  cudaMemcpyDeviceToHost, be_.stream()));
    ST_CUDA_CHECK(cudaMemcpyAsync(rs.data(), rowstats_.raw(), rows * sizeof(flash::RowStats),
                                  cudaMemcpyDeviceToHost, be_.stream()));
    ST_CUDA_CHECK(cudaStreamSynchronize(be_.stream()));
    stats_ =
        flash::merge_row_stats(call_dims(d), ptilde.data(), lse_h.data(), rs.data(), n.probs);
  }

  std::vector<float> to_host(const Tensor& t) {
    Tensor f = t;
    if (t.dtype() != DType::F32) {  // widen on the GPU (exact)
      f = be_.alloc(t.shape(), DType::F32);
      be_.copy(f, t);
    }
    std::vector<float> h(static_cast<size_t>(f.numel()));
    ST_CUDA_CHECK(cudaMemcpyAsync(h.data(), f.raw(), h.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, be_.stream()));
    ST_CUDA_CHECK(cudaStreamSynchronize(be_.stream()));
    return h;
  }

  CudaBackend& be_;
  AttentionConfig cfg_;
  int64_t B_ = -1, T_ = -1;
  int NH_ = -1;
  DType fmt_ = DType::F32;
  DeltaMode fwd_delta_ = DeltaMode::O;
  bool have_forward_ = false, have_delta_ = false;
  Tensor delta_;     // (B, NH, T) FP32
  Tensor o_saved_;   // o_fp32: (B, T, C) FP32; o_split: (B, T, C) residual in the format
  Tensor ptilde_;    // (B, NH, T) int32 P~ == 1 counts, collect_stats
  Tensor rowstats_;  // (B, NH, T) flash::RowStats, collect_stats
};

FlashAttentionCuda& flash_of(const Attention& attn) {
  auto* f = dynamic_cast<const FlashAttentionCuda*>(&attn);
  ST_CHECK(f != nullptr, "flash hook: attention '", attn.name(),
           "' was not made by make_attention_cuda_flash");
  return const_cast<FlashAttentionCuda&>(*f);
}

}  // namespace

std::unique_ptr<Attention> make_attention_cuda_flash(CudaBackend& be, const AttentionConfig& cfg) {
  return std::make_unique<FlashAttentionCuda>(be, cfg);
}

std::vector<float> flash_cuda_last_delta(const Attention& attn) {
  return flash_of(attn).last_delta();
}

std::vector<float> flash_cuda_saved_o(const Attention& attn) { return flash_of(attn).saved_o(); }

std::string flash_cuda_supported_tiles() { return flash::kFwdTilesText; }

}  // namespace st
