// Host-side interface between the flash attention class (cuda/flash_attention.cu) and the
// kernel files (flash_fwd_*.cu, flash_bwd_*.cu, flash_aux.cu): parameter blocks and the
// launchers. Raw device pointers; every launcher enqueues on `stream` and checks the launch.
// Layouts (the model's, read and written in place, row stride 3C or C, no permutes):
//   qkv (B, T, 3C), head h of q at columns [h*hs, (h+1)*hs), k at C + ..., v at 2C + ...
//   out, dout, o32, o_lo (B, T, C); lse, delta, p_tilde_one, row stats (B, NH, T).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace st::flash {

// What the kernels support (checked by the class before launching).
constexpr int kHeadDims[] = {64, 128};
// Forward tiles (block_q, block_k); the backward picks its own (see flash_bwd.cuh) and only
// needs block_q % 64 == 0 and block_k % 64 == 0 for the low-precision accumulator mode.
inline bool fwd_tiles_supported(int bq, int bk) {
  return (bq == 64 && bk == 64) || (bq == 128 && bk == 64) || (bq == 128 && bk == 128);
}
constexpr const char* kFwdTilesText = "(64, 64), (128, 64) or (128, 128)";

struct FwdParams {
  const void* qkv = nullptr;  // (B, T, 3C) storage T
  void* out = nullptr;        // (B, T, C) storage T
  float* lse = nullptr;       // (B, NH, T)
  float* o32 = nullptr;       // optional (delta o_fp32): O before its final rounding
  void* o_lo = nullptr;       // optional (delta o_split): round(O32 - O), O the stored out; T
  int32_t* p_tilde_one = nullptr;  // optional (collect_stats): per row, entries with P~ == 1
  int B = 0, T = 0, NH = 0, hs = 0;
  bool causal = true;
  bool scores_low = false;  // S rounded to the compute format after scaling
  float scale = 0;
  double beta = 2, tie_tol = 1e-3, cap = 43.67;  // stabilized flash
  // The O~ amplifiers (AttnNumerics::o_tilde_bits, o_tilde_gain, o_tilde_scope): read by the
  // kernels of fwd_amp_* only. o_tilde_tied: only the updates of tied key tiles (more than
  // one score within tie_tol of the tile's maximum) are amplified (scope tied); else all.
  int o_tilde_bits = 0;
  double o_tilde_gain = 0;
  bool o_tilde_tied = false;
};

struct BwdParams {
  const void* qkv = nullptr;   // (B, T, 3C)
  const void* dout = nullptr;  // (B, T, C)
  const float* lse = nullptr;  // (B, NH, T)
  float* delta = nullptr;      // (B, NH, T): written by the delta pass, read by the others
  void* dqkv = nullptr;        // (B, T, 3C), overwritten
  int B = 0, T = 0, NH = 0, hs = 0;
  bool causal = true;
  bool scores_low = false;
  float scale = 0;
  int block_q = 64, block_k = 64;  // the low-precision accumulators round at these tiles
};

// Forward. stab: stabilized flash; acc_low: O~, l and alpha in the compute format (the
// paper's BF16 accumulator) instead of FP32.
void fwd_bf16(const FwdParams& p, int bq, int bk, bool stab, bool acc_low, cudaStream_t s);
void fwd_f16(const FwdParams& p, int bq, int bk, bool stab, bool acc_low, cudaStream_t s);
// The same with the O~ amplifier of p (o_tilde_bits or o_tilde_gain set; flash_fwd_amp_*.cu):
// O~ in FP32 registers, each key tile's P~V formed from zero and merged as the CPU lab's
// flash_forward does, in FP64 (flash_fwd.cuh, merge_pv_amp).
void fwd_amp_bf16(const FwdParams& p, int bq, int bk, bool stab, bool acc_low, cudaStream_t s);
void fwd_amp_f16(const FwdParams& p, int bq, int bk, bool stab, bool acc_low, cudaStream_t s);

// Forward on Hopper (sm_90a: TMA, wgmma, warp-specialised; flash_fwd_sm90.cuh): tiles
// (128, 128), head sizes 64 and 128, the same parameters and the same numerics as fwd_*.
void fwd_sm90_bf16(const FwdParams& p, bool stab, bool acc_low, cudaStream_t s);
void fwd_sm90_f16(const FwdParams& p, bool stab, bool acc_low, cudaStream_t s);

// Backward: dK/dV kernel and dQ kernel (deterministic, no atomics). delta must be filled.
void bwd_bf16(const BwdParams& p, bool acc_low, cudaStream_t s);
void bwd_f16(const BwdParams& p, bool acc_low, cudaStream_t s);
// delta = rowsum(dP * P) over the whole row (delta mode dp_p): a separate pass.
void delta_dpp_bf16(const BwdParams& p, bool acc_low, cudaStream_t s);
void delta_dpp_f16(const BwdParams& p, bool acc_low, cudaStream_t s);
// Hopper (sm_90a, flash_bwd_sm90.cuh), the same numerics and tiles as the mma.sync kernels:
// the dK/dV kernel, and the dQ kernel or (delta_pass) the dp_p delta pass.
void dkdv_sm90_bf16(const BwdParams& p, bool acc_low, cudaStream_t s);
void dkdv_sm90_f16(const BwdParams& p, bool acc_low, cudaStream_t s);
void dq_sm90_bf16(const BwdParams& p, bool acc_low, bool delta_pass, cudaStream_t s);
void dq_sm90_f16(const BwdParams& p, bool acc_low, bool delta_pass, cudaStream_t s);

// delta = rowsum(dO * O) (flash_aux.cu), one thread per row, the CPU's sequential FMA chain:
//   mode 0 (o):      O = out
//   mode 1 (o_split): O = float(out) + float(o_lo)  (one FP32 rounding of hi + lo)
//   mode 2 (o_fp32):  O = o32
// acc_low: delta rounded to the compute format (accum).
void delta_o(DType dtype, int mode, bool acc_low, const void* dout, const void* out,
             const void* o_lo, const float* o32, float* delta, int B, int T, int NH, int hs,
             cudaStream_t s);

// Per-row statistics (flash_aux.cu): one warp per row recomputes the row's scores exactly as
// the CPU lab (sequential FP32 FMA dot products) and writes
struct RowStats {
  float max_logit;  // largest scaled score of the row
  int32_t flags;    // bit 0: tied maximum (another score within tie_tol), bit 1: tied in tile
  double entropy;   // softmax entropy (nats), FP64
};
void row_stats(DType dtype, const void* qkv, RowStats* out, int B, int T, int NH, int hs,
               bool causal, bool scores_low, float scale, double tie_tol, int block_k,
               cudaStream_t s);

}  // namespace st::flash
