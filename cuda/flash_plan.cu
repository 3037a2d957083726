// The host-side plan of a flash attention call (see flash_plan.h): the one place where an
// AttentionConfig becomes FwdParams / BwdParams and launcher calls.
#include <cmath>

#include "attention/head_cpu.h"
#include "core/error.h"
#include "cuda/flash_plan.h"

namespace st::flash {

float scale_of(int hs) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
}

AttnNumerics resolve_numerics(const AttentionConfig& cfg, DType fmt) {
  const char* kind = attention_kind_name(cfg.kind);
  if (fmt != DType::BF16 && fmt != DType::F16)
    fail("attention.backend = ", kind, " on the GPU needs a bf16 or fp16 compute format (got ",
         dtype_name(fmt), "); use attention.backend: baseline for ", dtype_name(fmt));
  const AttnNumerics n = cfg.numerics(fmt, 0);  // fp32_out_heads is refused: every head alike
  auto must_be_fmt = [&](DType got, const char* key) {
    if (got != fmt)
      fail("attention.", key, " = ", dtype_name(got),
           " is not supported by the CUDA flash kernels (it must be the compute format, ",
           dtype_name(fmt), ")");
  };
  must_be_fmt(n.qkv, "qkv");
  must_be_fmt(n.probs, "probs");
  must_be_fmt(n.out, "out");
  must_be_fmt(n.grads, "grads");
  if (n.mac != DType::F32)
    fail("attention.mac = ", dtype_name(n.mac),
         " is not supported by the CUDA flash kernels (fp32)");
  if (n.scores != DType::F32 && n.scores != fmt)
    fail("attention.scores = ", dtype_name(n.scores),
         " is not supported by the CUDA flash kernels (fp32 or the compute format, ",
         dtype_name(fmt), ")");
  if (n.accum != DType::F32 && n.accum != fmt)
    fail("attention.accum = ", dtype_name(n.accum),
         " is not supported by the CUDA flash kernels (fp32 or the compute format, ",
         dtype_name(fmt), ")");
  if (n.round_ops) fail("attention.rule = ", rounding_rule_name(cfg.rule), " is CPU only");
  check_amplifier(cfg);
  return n;
}

void check_amplifier(const AttentionConfig& cfg) {
  if (cfg.o_tilde_scope == OTildeScope::UntiedMatched)
    fail("attention.o_tilde_scope = untied_matched is CPU only (its tiles are chosen over a "
         "head's whole call; the CUDA flash kernels amplify all tiles or the tied ones): use "
         "all or tied, or run it with device: cpu");
  if (cfg.tie_break != 0)
    fail("attention.tie_break = ", cfg.tie_break,
         " is CPU only (the CUDA flash kernels do not break ties); run it with device: cpu");
  const bool amp = cfg.o_tilde_bits != 0 || cfg.o_tilde_gain != 0;
  if (amp && cfg.cuda_kernel == FlashKernel::Sm90)
    fail("attention.o_tilde_", cfg.o_tilde_bits ? "bits" : "gain", " is implemented in the "
         "mma_sync flash kernels only: set attention.cuda_kernel: mma_sync (the sm90 kernel "
         "keeps O~ in wgmma's accumulators)");
}

namespace {
// The fields FwdParams and BwdParams share: the call's shape and scores.
template <class P>
void set_shape(P& p, const AttentionConfig& cfg, const AttnNumerics& n, const CallDims& d) {
  p.B = d.B;
  p.T = d.T;
  p.NH = d.NH;
  p.hs = d.hs;
  p.causal = cfg.causal;
  p.scores_low = n.scores != DType::F32;
  p.scale = scale_of(d.hs);
}
}  // namespace

void check_kernel_tiles(const AttentionConfig& cfg) {
  if (cfg.cuda_kernel == FlashKernel::Sm90 && (cfg.block_q != 128 || cfg.block_k != 128))
    fail("attention.cuda_kernel = sm90 needs attention.block_q = 128 and attention.block_k = "
         "128 (got ", cfg.block_q, ", ", cfg.block_k, "): its tiles are fixed, and block_k "
         "sets where the low-precision accumulator rounds");
}

void run_forward(const AttentionConfig& cfg, const AttnNumerics& n, DType fmt, const CallDims& d,
                 const Buffers& b, cudaStream_t s) {
  FwdParams p;
  p.qkv = b.qkv;
  p.out = b.out;
  p.lse = b.lse;
  p.o32 = n.delta == DeltaMode::OFp32 ? static_cast<float*>(b.saved) : nullptr;
  p.o_lo = n.delta == DeltaMode::OSplit ? b.saved : nullptr;
  p.p_tilde_one = b.p_tilde_one;
  set_shape(p, cfg, n, d);
  p.beta = cfg.beta;
  p.tie_tol = cfg.tie_tol;
  p.cap = stabilized_max_shift(cfg, n.probs);
  p.o_tilde_bits = n.o_tilde_bits;
  p.o_tilde_gain = n.o_tilde_gain;
  p.o_tilde_tied = n.o_tilde_scope == OTildeScope::Tied;
  const bool stab = cfg.kind == AttentionKind::StabilizedFlash;
  const bool acc_low = n.accum != DType::F32;
  if (n.o_tilde_bits || n.o_tilde_gain != 0) {
    check_amplifier(cfg);
    if (fmt == DType::BF16)
      fwd_amp_bf16(p, cfg.block_q, cfg.block_k, stab, acc_low, s);
    else
      fwd_amp_f16(p, cfg.block_q, cfg.block_k, stab, acc_low, s);
    return;
  }
  if (cfg.cuda_kernel == FlashKernel::Sm90) {
    check_kernel_tiles(cfg);
    if (fmt == DType::BF16)
      fwd_sm90_bf16(p, stab, acc_low, s);
    else
      fwd_sm90_f16(p, stab, acc_low, s);
    return;
  }
  if (fmt == DType::BF16)
    fwd_bf16(p, cfg.block_q, cfg.block_k, stab, acc_low, s);
  else
    fwd_f16(p, cfg.block_q, cfg.block_k, stab, acc_low, s);
}

void run_backward(const AttentionConfig& cfg, const AttnNumerics& n, DType fmt, const CallDims& d,
                  const Buffers& b, cudaStream_t s) {
  BwdParams p;
  p.qkv = b.qkv;
  p.dout = b.dout;
  p.lse = b.lse;
  p.delta = b.delta;
  p.dqkv = b.dqkv;
  set_shape(p, cfg, n, d);
  p.block_q = cfg.block_q;
  p.block_k = cfg.block_k;
  const bool acc_low = n.accum != DType::F32;
  // sm90: the Hopper dK/dV and dQ kernels and dp_p delta pass.
  const bool sm90 = cfg.cuda_kernel == FlashKernel::Sm90;
  auto dq_sm90 = [&](bool delta_pass) {
    if (fmt == DType::BF16)
      dq_sm90_bf16(p, acc_low, delta_pass, s);
    else
      dq_sm90_f16(p, acc_low, delta_pass, s);
  };
  if (n.delta == DeltaMode::DpP) {
    if (sm90)
      dq_sm90(true);
    else if (fmt == DType::BF16)
      delta_dpp_bf16(p, acc_low, s);
    else
      delta_dpp_f16(p, acc_low, s);
  } else {
    ST_CHECK(n.delta == DeltaMode::O || n.delta == DeltaMode::OSplit || n.delta == DeltaMode::OFp32,
             "attention.delta = ", delta_mode_name(n.delta),
             " is CPU only; the CUDA flash kernels support o, o_split, o_fp32 and dp_p");
    const int mode = n.delta == DeltaMode::O ? 0 : n.delta == DeltaMode::OSplit ? 1 : 2;
    delta_o(fmt, mode, acc_low, b.dout, b.out, mode == 1 ? b.saved : nullptr,
            mode == 2 ? static_cast<const float*>(b.saved) : nullptr, p.delta, p.B, p.T, p.NH, p.hs,
            s);
  }
  if (sm90) {
    if (fmt == DType::BF16)
      dkdv_sm90_bf16(p, acc_low, s);
    else
      dkdv_sm90_f16(p, acc_low, s);
    dq_sm90(false);
    return;
  }
  if (fmt == DType::BF16)
    bwd_bf16(p, acc_low, s);
  else
    bwd_f16(p, acc_low, s);
}

void run_row_stats(const AttentionConfig& cfg, const AttnNumerics& n, DType fmt, const CallDims& d,
                   const void* qkv, RowStats* rs, cudaStream_t s) {
  row_stats(fmt, qkv, rs, d.B, d.T, d.NH, d.hs, cfg.causal, n.scores != DType::F32, scale_of(d.hs),
            cfg.tie_tol, cfg.block_k, s);
}

// p_one of a row: entries of the normalised P = round_probs(exp(S - lse)) equal to 1, as the
// CPU lab counts them (P as the backward recomputes it). Only the row's unique maximum can
// qualify: P = 1 needs P >= 1 - 2^-9 (BF16; 1 - 2^-12 FP16), and two such entries would sum
// to more than 1; with a tied maximum exp(max - lse) <= 1/2. So the count is whether
// exp(max_logit - lse), formed in FP64 as the CPU lab does (the gpu rule rounds no
// intermediate), rounds to 1 in probs: no per-entry pass, no extra kernel output.
std::vector<AttentionHeadStats> merge_row_stats(const CallDims& d, const int32_t* p_tilde_one,
                                                const float* lse, const RowStats* rs,
                                                DType probs) {
  std::vector<AttentionHeadStats> stats(d.NH, AttentionHeadStats{});
  for (int64_t bh = 0; bh < int64_t{d.B} * d.NH; ++bh) {
    AttentionHeadStats h;
    for (int64_t t = 0; t < d.T; ++t) {
      const size_t r = static_cast<size_t>(bh * d.T + t);
      const double p_max =
          std::exp(static_cast<double>(rs[r].max_logit) - static_cast<double>(lse[r]));
      const int64_t p_one = round_fmt(p_max, probs) == 1.0;
      h.add_row(rs[r].max_logit, (rs[r].flags & 1) != 0, (rs[r].flags & 2) != 0, p_one,
                p_tilde_one[r], rs[r].entropy);
    }
    stats[bh % d.NH].merge(h);
  }
  return stats;
}

}  // namespace st::flash
