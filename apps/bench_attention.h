// What bench attention's two files share: bench_attention.cpp (the command, the speed, memory
// and deviation tables) and bench_attention_delta.cpp (the delta-mode table, CUDA builds only):
// the options, one problem's device tensors, and the timing of one method on it.
#pragma once
#include <string>

#include "core/backend.h"

namespace st::attn_bench {

struct AttnBenchArgs {
  std::string ds = "64,128";
  std::string Ts = "1024,2048,4096,8192,16384";
  // A method ending in _sm90 runs the Hopper forward kernel (attention.cuda_kernel: sm90,
  // tiles 128x128) with the mma.sync backward.
  std::string methods = "flash,stabilized_flash,flash_sm90,stabilized_flash_sm90,cudnn,baseline";
  std::string tiles = "auto";  // auto: d 64 -> 128x128, d 128 -> 128x64; or e.g. 64x64
  std::string dtype = "bf16";
  int tokens = 16384, width = 2048;
  int reps = 10, warmup = 2;
  bool memory = true, deltas = true, deviation = true;
  int delta_T = 4096;
};

// Device tensors of one problem. qkv and dout are drawn once (B*T*3C is the same for every
// T at a fixed token count) and viewed with each shape.
struct Problem {
  int B, T, H, d;
  Tensor qkv, dout, out, lse, dqkv;
};

struct Timing {
  bool ok = false;
  std::string error;
  double fwd = 0, bwd = 0, both = 0;  // ms
};

// Flash tiles for head dim d: --tiles auto (d 64 -> 128x128, d 128 -> 128x64) or QxK.
void tiles_for(const AttnBenchArgs& a, int d, int& bq, int& bk);
// FLOPs of one attention forward: 4 B T^2 H d, halved when causal.
double fwd_flops(int B, int T, int H, int d, bool causal);
// Median forward, backward and forward + backward times of `cfg` on `p` over a.reps runs.
Timing time_method(Backend& be, const AttentionConfig& cfg, Problem& p, DType fmt, const AttnBenchArgs& a);
std::string fmt_num(double x, const char* f = "%.1f");
// Table 4: each delta mode's backward time and its delta's error against FP64 on tied-maximum
// rows; `d` is the head dim of the timing (a CPU-only build prints a note instead).
void delta_mode_table(Backend& be, const AttnBenchArgs& a, DType fmt, int d);

}  // namespace st::attn_bench
