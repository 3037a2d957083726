// The host-side plan of one flash attention call, shared by the CUDA Attention class
// (cuda/flash_attention.cu) and the SIMT emulator's tests (tests/simt/test_simt_flash.cpp),
// so both run the same parameter filling and launch sequence: from an AttentionConfig and
// raw device pointers to the launchers of flash_launch.cuh. Plain C++ (no device code).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/attention.h"
#include "core/attention_numerics.h"
#include "core/dtype.h"
#include "cuda/flash_launch.cuh"

namespace st::flash {

// 1 / sqrt(hs), rounded once to FP32 (the CPU lab's scale).
float scale_of(int hs);

// The formats of a call in compute format fmt, checked against what the kernels implement;
// anything else throws a one-line error naming the attention.* key.
AttnNumerics resolve_numerics(const AttentionConfig& cfg, DType fmt);

// Device buffers of one call (layouts in flash_launch.cuh). saved: what the delta mode keeps
// between forward and backward (o_fp32: O in FP32; o_split: the residual in fmt; otherwise
// null); p_tilde_one: per-row P~ == 1 counts when statistics are collected, else null.
struct Buffers {
  const void* qkv = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  void* saved = nullptr;
  int32_t* p_tilde_one = nullptr;
  // backward only
  const void* dout = nullptr;
  float* delta = nullptr;
  void* dqkv = nullptr;
};
struct CallDims {
  int B = 0, T = 0, NH = 0, hs = 0;
};

// The O~ amplifier settings the CUDA kernels run (o_tilde_bits, o_tilde_gain with scope all
// or tied, on the mma_sync kernels); anything else throws a one-line error naming the key.
void check_amplifier(const AttentionConfig& cfg);

// attention.cuda_kernel = sm90 runs tiles (128, 128) only: anything else throws a one-line
// error naming the keys (the class checks it at construction, run_forward again).
void check_kernel_tiles(const AttentionConfig& cfg);

// The forward kernel of cfg (flash or stabilized, tiles, accumulator mode).
void run_forward(const AttentionConfig& cfg, const AttnNumerics& n, DType fmt, const CallDims& d,
                 const Buffers& b, cudaStream_t s);
// The delta pass of the delta mode, then dK/dV and dQ.
void run_backward(const AttentionConfig& cfg, const AttnNumerics& n, DType fmt, const CallDims& d,
                  const Buffers& b, cudaStream_t s);
// The per-row statistics kernel (flash_aux.cu) into rs[(B, NH, T)].
void run_row_stats(const AttentionConfig& cfg, const AttnNumerics& n, DType fmt, const CallDims& d,
                   const void* qkv, RowStats* rs, cudaStream_t s);
// Host merge of the per-row values (copied back) into per-head statistics, in a fixed order
// (per (b, h), rows in order; then heads over b), as the CPU backend merges. p_tilde_one: the
// forward kernel's P~ == 1 counts; lse: the forward's lse, from which each row's p_one (the
// normalised P == 1, in format probs) is derived (see flash_plan.cu).
std::vector<AttentionHeadStats> merge_row_stats(const CallDims& d, const int32_t* p_tilde_one,
                                                const float* lse, const RowStats* rs,
                                                DType probs);

}  // namespace st::flash
