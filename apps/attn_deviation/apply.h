// attn_deviation apply: a production attention backend's forward on inputs from a file
// (apps/attn_deviation/apply.cpp).
#pragma once
#include <string>

namespace st::attn_tool {

struct ApplyArgs {
  std::string qkv, out, lse;         // input (B, T, 3C) raw bf16; O; lse (optional)
  int B = 0, T = 0, NH = 0, hs = 0;
  std::string backend;               // baseline | flash | stabilized_flash | cudnn
  std::string device = "cpu";        // cpu | cuda
  std::string compute = "bf16";      // bf16 | fp32 | fp64 (fp64: the lab's FP64 golden)
  std::string accum;                 // "" / auto: the rule's; else the accumulator format
  std::string cuda_kernel;           // "" (default) | mma_sync | sm90
  double beta = 2.0;
  bool beta_given = false;
  int block_q = 64, block_k = 64;
  bool block_q_given = false, block_k_given = false;
  bool causal = false;
  int chunk = 0;    // sequences (batch rows) per forward call; 0: all at once
  int threads = 0;  // CPU backend threads (0: default)
};

int apply_cmd(const ApplyArgs& a);

}  // namespace st::attn_tool
