// simt_attention_cost: the cost model of compute-bound kernels (cost_model.h, "compute-bound
// kernels"; issue 43) on our flash attention kernels. Each row of `bench attention`'s speed
// table (BF16, causal, B*T = 16384, H*d = 2048; tiles 128x128 at d = 64, 128x64 at d = 128)
// runs in the SIMT emulator: the forward kernel (flash and stabilized_flash), the backward's
// delta pass (memory-bound: predict_kernel with h200_calibration()), dK/dV and dQ kernels,
// each on an even sample of its blocks (max_blocks), counting mma.sync, ex2, shared
// wavefronts and barriers per block. The registers per thread come from ptxas -v
// (ptxas_sm90_flash_bf16.txt here). Prints per row the H200 time measured on 2026-11-28
// (../shared/gpu/2026-11-28_h200_bench_attention.txt), the prediction, the error, and the
// error with the row left out of the fit (leave-one-out).
//
//   simt_attention_cost [--max-blocks N] [--csv FILE] [--refit] [--launches] [--no-loo]
//                       [--only flash|baseline]
// Default: the fixed calibration h200_attention_calibration(); --refit fits again (and
// prints the parameters); leave-one-out errors are refitted per row (--no-loo: skipped).
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/attention.h"
#include "cuda/attention_softmax.h"
#include "cuda/flash_plan.h"
#include "simt/cost/cost_model.h"
#include "simt/cost/emu_run.h"
#include "simt/simt.h"

#ifndef ST_COST_DIR
#error "ST_COST_DIR: the directory of ptxas_sm90_flash_bf16.txt (tests/simt/CMakeLists.txt)"
#endif

namespace st::cost {
namespace {

// ptxas -v registers: "kernel args regs ..." lines of ptxas_sm90_flash_bf16.txt.
std::map<std::string, int> read_regs() {
  const std::string path = std::string(ST_COST_DIR) + "/ptxas_sm90_flash_bf16.txt";
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::map<std::string, int> regs;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string k, args;
    int r = 0;
    s >> k >> args >> r;
    regs[k + " " + args] = r;
  }
  return regs;
}
int regs_of(const std::map<std::string, int>& regs, const std::string& key) {
  auto it = regs.find(key);
  if (it == regs.end()) throw std::runtime_error("no ptxas registers for " + key);
  return it->second;
}

// bench attention on the H200, 2026-11-28 (ms, medians of 10): d, T, then fwd and bwd of
// flash, stabilized_flash and baseline.
struct Measured {
  int d, T;
  double fwd[3], bwd[3];
};
const Measured kMeasured[] = {
    {64, 1024, {0.723, 0.759, 3.642}, {2.739, 2.735, 3.941}},
    {64, 2048, {1.185, 1.252, 5.449}, {4.835, 4.807, 5.895}},
    {64, 4096, {2.098, 2.255, 9.227}, {8.979, 8.979, 9.795}},
    {64, 8192, {3.972, 4.260, 17.404}, {17.328, 17.354, 18.957}},
    {64, 16384, {7.695, 8.203, 39.475}, {33.969, 34.011, 41.672}},
    {128, 1024, {0.548, 0.593, 2.237}, {1.974, 1.962, 2.738}},
    {128, 2048, {0.897, 0.986, 3.193}, {3.385, 3.382, 3.746}},
    {128, 4096, {1.624, 1.785, 5.407}, {6.318, 6.273, 5.721}},
    {128, 8192, {3.039, 3.358, 9.302}, {12.029, 11.999, 10.347}},
    {128, 16384, {5.834, 6.476, 20.320}, {23.406, 23.404, 21.709}},
};

constexpr uint64_t kBaselineBlocks = 97;
// FP64 PTX instructions per element of the baseline's softmax kernels (nvcc 13.0 -O3
// -arch=sm_90 --fmad=false -ptx; the command is in README.md here): exp of a double
// difference 39 (77 instructions against the identity kernel's 11, 39 of them .f64), one
// div.rn.f64 (one PTX instruction; its SASS expansion is left to k_fp64), and the backward's
// P * (dP - delta) 6.
constexpr double kFp64Exp = 39, kFp64Div = 1, kFp64Bwd = 6;

// PyTorch SDPA's FlashAttention-2 forward on the same H200 in the same call (torch 2.11,
// bf16, causal; ../shared/gpu/2026-11-28_h200_bench_attention.txt, "torch attention"), ms:
// the comparison figure of the sm_90 predictions, in kMeasured's order.
const double kTorchFa2Fwd[] = {0.341, 0.552, 1.000, 1.904, 3.733, 0.304, 0.514, 0.927, 1.729, 3.414};

struct Args {
  uint64_t max_blocks = 4;
  std::string csv, sm90_csv;
  bool refit = false, launches = false, loo = true, sm90 = false;
  std::string only;  // --only flash|baseline: those rows alone
};

// The mma.sync backward kernels' ptxas registers (dK/dV, dQ) at head size d, accumulator mode acc.
void bwd_regs(const std::map<std::string, int>& regs, int d, int acc, int& dkdv_regs, int& dq_regs) {
  dkdv_regs = dq_regs = 0;
  for (const auto& [k, r] : regs) {
    const std::string hd = std::to_string(d) + ",";
    const std::string tail = "," + std::to_string(acc);
    auto ends = [&](const std::string& s) {
      return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    const std::string args = k.substr(k.find(' ') + 1);
    if (k.rfind("dkdv_kernel " + hd, 0) == 0 && ends(args)) dkdv_regs = r;
    if (k.rfind("dq_kernel " + hd, 0) == 0 && ends(args) &&
        args.substr(0, args.size() - tail.size()).back() == '0')
      dq_regs = r;
  }
  if (!dkdv_regs || !dq_regs) throw std::runtime_error("no ptxas registers for the backward");
}

// A row of the table: its name, shape and measured time (ms; kept in us).
ComputeRow row_of(const std::string& name, const std::string& shape, double measured_ms) {
  ComputeRow r;
  r.name = name;
  r.shape = shape;
  r.measured_us = measured_ms * 1e3;
  return r;
}

std::vector<ComputeRow> build_rows(const Args& a) {
  const auto regs = read_regs();
  std::vector<ComputeRow> rows;
  const DType fmt = DType::BF16;
  for (const Measured& m : kMeasured) {
    const int d = m.d, T = m.T, H = 2048 / d, B = 16384 / T, C = H * d;
    const size_t BT = static_cast<size_t>(B) * T;
    Mem qkv(BT * 3 * C * 2), out(BT * C * 2), lse(BT * H * 4), saved(BT * C * 4), dout(BT * C * 2),
        delta(BT * H * 4), dqkv(BT * 3 * C * 2);
    flash::Buffers b;
    b.qkv = qkv.p, b.out = out.p, b.lse = static_cast<float*>(lse.p), b.saved = saved.p;
    b.dout = dout.p, b.delta = static_cast<float*>(delta.p), b.dqkv = dqkv.p;
    const flash::CallDims cd{B, T, H, d};
    const std::string shape = "d=" + std::to_string(d) + " T=" + std::to_string(T) +
                              " B=" + std::to_string(B) + " H=" + std::to_string(H);
    std::vector<simt::LaunchTraffic> bwd;
    int dkdv_regs = 0, dq_regs = 0;
    for (int kind = 0; kind < (a.only == "baseline" ? 0 : 2); ++kind) {
      AttentionConfig cfg;
      cfg.kind = kind == 0 ? AttentionKind::Flash : AttentionKind::StabilizedFlash;
      cfg.causal = true;
      cfg.block_q = 128;
      cfg.block_k = d == 64 ? 128 : 64;
      const AttnNumerics n = flash::resolve_numerics(cfg, fmt);
      const int acc = n.accum != DType::F32 ? 1 : 0;
      const char* kname = kind == 0 ? "flash" : "stabilized_flash";
      ComputeRow f = row_of(std::string(kname) + " fwd", shape, m.fwd[kind]);
      const auto fl = traced(a.max_blocks, [&] { flash::run_forward(cfg, n, fmt, cd, b, nullptr); });
      const int fr = regs_of(regs, "fwd_kernel " + std::to_string(d) + ",128," +
                                       std::to_string(cfg.block_k) + "," + std::to_string(kind) +
                                       "," + std::to_string(acc));
      for (const auto& l : fl) f.compute.emplace_back(l, fr);
      rows.push_back(f);
      if (kind == 0) {  // the backward kernels do not depend on the kind: run once
        bwd = traced(a.max_blocks, [&] { flash::run_backward(cfg, n, fmt, cd, b, nullptr); });
        bwd_regs(regs, d, acc, dkdv_regs, dq_regs);
      }
      ComputeRow w = row_of(std::string(kname) + " bwd", shape, m.bwd[kind]);
      int k_bwd = 0;  // BwdParams launches: dK/dV first, then dQ
      for (const auto& l : bwd) {
        if (l.kernel.find("BwdParams") != std::string::npos)
          w.compute.emplace_back(l, k_bwd++ == 0 ? dkdv_regs : dq_regs);
        else
          w.memory.push_back(l);
      }
      rows.push_back(w);
    }
    // baseline (cuda/attention_baseline.cu): heads split into (BH, T, d) matrices, S = Q K^T
    // and O = P V by cuBLASLt (not emulated: by FLOPs and bytes), softmax_forward in place
    // on S; backward: dP = dO V^T, dV = P^T dO, softmax_backward, dQ = dS K, dK = dS^T Q.
    // Our kernels run in the emulator on kBaselineBlocks blocks each (a prime, so that the
    // sampled rows of the softmax spread over the causal row lengths) and are predicted by
    // the memory-bound model (h200_calibration()).
    if (a.only != "flash") {
      const int64_t BH = static_cast<int64_t>(B) * H, rows_n = BH * T;
      Mem q(BH * T * d * 2), k(BH * T * d * 2), v(BH * T * d * 2), o(BH * T * d * 2),
          SP(static_cast<size_t>(rows_n) * T * 2), dP(static_cast<size_t>(rows_n) * T * 2);
      const int64_t C3 = 3 * C;
      const double mm_flop = 2.0 * BH * T * T * d;  // every head GEMM: T x T x d
      const double st_bytes = 2.0 * BH * (static_cast<double>(T) * T + 2.0 * T * d);  // S or P + two (T, d)
      const double visible = static_cast<double>(BH) * T * (T + 1) / 2.0;
      auto split_qkv = [&] {  // q, k and v from qkv: the first launches of both passes
        for (int i = 0; i < 3; ++i)
          cudak::attn_split_heads(i == 0 ? q.p : i == 1 ? k.p : v.p, qkv.p, B, T, H, d, d, C3,
                                  i * C, fmt, nullptr);
      };
      ComputeRow f = row_of("baseline fwd", shape, m.fwd[2]);
      f.memory = traced(kBaselineBlocks, [&] {
        split_qkv();
        cudak::softmax_forward(SP.p, static_cast<float*>(lse.p), rows_n, T, T, true,
                               cudak::SoftmaxRowStats{}, AttentionConfig{}.tie_tol, fmt, nullptr);
        cudak::attn_merge_heads(out.p, o.p, B, T, H, d, d, C, 0, fmt, nullptr);
      });
      f.gemms = {{mm_flop, st_bytes}, {mm_flop, st_bytes}};
      // FP64 per visible (causal) element: exp (39 FP64 PTX instructions, kFp64Exp) and the
      // division; rows longer than the shared row cache (T > 12160) compute exp twice
      // the launches: 3 splits, the softmax, the merge
      f.memory_fp64 = {0, 0, 0, visible * ((T > 12160 ? 2 : 1) * kFp64Exp + kFp64Div), 0};
      rows.push_back(f);
      ComputeRow w = row_of("baseline bwd", shape, m.bwd[2]);
      w.memory = traced(kBaselineBlocks, [&] {
        split_qkv();
        cudak::attn_split_heads(o.p, dout.p, B, T, H, d, d, C, 0, fmt, nullptr);
        cudak::softmax_backward(dP.p, SP.p, rows_n, T, T, true, fmt, nullptr);
        for (int i = 0; i < 3; ++i)
          cudak::attn_merge_heads(dqkv.p, i == 0 ? q.p : i == 1 ? k.p : v.p, B, T, H, d, d, C3,
                                  i * C, fmt, nullptr);
      });
      w.gemms = {{mm_flop, st_bytes}, {mm_flop, st_bytes}, {mm_flop, st_bytes}, {mm_flop, st_bytes}};
      w.memory_fp64 = {0, 0, 0, 0, visible * kFp64Bwd, 0, 0, 0};  // 4 splits, softmax, 3 merges
      rows.push_back(w);
    }
  }
  return rows;
}

// Predictions for the sm_90 forward kernel (cuda/flash_fwd_sm90.cuh), which no GPU has run:
// the emulator's counts of its launch (wgmma M*N*K, TMA bytes, ex2, per block) at the table's
// shapes, through predict_attention_kernel with the calibration (overlap as fitted on the
// mma.sync kernels: the pipes' times add) and with overlap 0 (the pipes fully overlapped, which
// the ping-pong and the in-warpgroup pipelining aim at): an interval. Registers: ptxas's 168
// (__launch_bounds__(384, 1): one block per SM, as its 160-192 KB of shared memory also allow).
void sm90_predictions(const Args& a, const Gpu& g, const ComputeParams& p) {
  constexpr int kSm90Regs = 168;  // ptxas -v, every instantiation (tests/simt/cost/README.md)
  const DType fmt = DType::BF16;
  ComputeParams p0 = p;
  p0.overlap = 0;
  std::printf("\n## sm_90 forward kernel: predicted (not measured), H200\n\n");
  std::printf("| method | shape | predicted ms (pipes add) | predicted ms (pipes overlap) | "
              "TFLOP/s | mma.sync fwd measured ms | ratio | torch FA2 fwd ms | ratio | bound |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  std::FILE* csv = a.sm90_csv.empty() ? nullptr : std::fopen(a.sm90_csv.c_str(), "w");
  if (!a.sm90_csv.empty() && !csv) throw std::runtime_error("cannot write " + a.sm90_csv);
  if (csv)
    std::fprintf(csv, "method,d,T,B,H,pred_add_ms,pred_overlap_ms,tflops_add,tflops_overlap,"
                      "mma_sync_fwd_ms,torch_fa2_fwd_ms,bound\n");
  const auto regs = read_regs();
  std::vector<std::string> bwd_lines;
  for (size_t i = 0; i < std::size(kMeasured); ++i) {
    const Measured& m = kMeasured[i];
    const int d = m.d, T = m.T, H = 2048 / d, B = 16384 / T, C = H * d;
    const size_t BT = static_cast<size_t>(B) * T;
    Mem qkv(BT * 3 * C * 2), out(BT * C * 2), lse(BT * H * 4), dout(BT * C * 2),
        delta(BT * H * 4), dqkv(BT * 3 * C * 2);
    flash::Buffers b;
    b.qkv = qkv.p, b.out = out.p, b.lse = static_cast<float*>(lse.p);
    b.dout = dout.p, b.delta = static_cast<float*>(delta.p), b.dqkv = dqkv.p;
    const flash::CallDims cd{B, T, H, d};
    for (int kind = 0; kind < 2; ++kind) {
      AttentionConfig cfg;
      cfg.kind = kind == 0 ? AttentionKind::Flash : AttentionKind::StabilizedFlash;
      cfg.causal = true;
      cfg.block_q = cfg.block_k = 128;
      cfg.cuda_kernel = FlashKernel::Sm90;
      const AttnNumerics n = flash::resolve_numerics(cfg, fmt);
      const auto fl = traced(a.max_blocks, [&] { flash::run_forward(cfg, n, fmt, cd, b, nullptr); });
      if (fl.size() != 1) throw std::runtime_error("sm90 forward: expected one launch");
      const ComputeTerms k1 = predict_attention_kernel(fl[0], g, p, kSm90Regs);
      const ComputeTerms k0 = predict_attention_kernel(fl[0], g, p0, kSm90Regs);
      const double flop = 4.0 * B * static_cast<double>(T) * T * H * d / 2;  // causal
      const double t1 = (k1.t) / 1e3, t0 = (k0.t) / 1e3;
      const char* name = kind == 0 ? "flash_sm90" : "stabilized_flash_sm90";
      char shape[64];
      std::snprintf(shape, sizeof shape, "d=%d T=%d B=%d H=%d", d, T, B, H);
      std::printf("| %s | %s | %.3f | %.3f | %.0f-%.0f | %.3f | %.2f-%.2f | %.3f | %.2f-%.2f | %s |\n",
                  name, shape, t1, t0, flop / (t1 * 1e9), flop / (t0 * 1e9), m.fwd[kind],
                  m.fwd[kind] / t1, m.fwd[kind] / t0, kTorchFa2Fwd[i], kTorchFa2Fwd[i] / t1,
                  kTorchFa2Fwd[i] / t0, k1.bound);
      if (csv)
        std::fprintf(csv, "%s,%d,%d,%d,%d,%.4f,%.4f,%.1f,%.1f,%.4f,%.4f,%s\n", name, d, T, B, H, t1,
                     t0, flop / (t1 * 1e9), flop / (t0 * 1e9), m.fwd[kind], kTorchFa2Fwd[i],
                     k1.bound);
      std::fflush(stdout);
      if (kind != 0) continue;
      // The sm90 backward: the delta pass (memory-bound model), the sm_90 dK/dV and dQ kernels
      // (168 registers), each predicted; the mma.sync backward predicted the same way beside
      // it (its ptxas registers; both under the calibration).
      int dkdv_regs = 0, dq_regs = 0;
      bwd_regs(regs, d, 0, dkdv_regs, dq_regs);
      ComputeRow hop, ref;
      for (ComputeRow* r : {&hop, &ref}) {
        AttentionConfig bc = cfg;
        if (r == &ref) bc.cuda_kernel = FlashKernel::MmaSync, bc.block_k = d == 64 ? 128 : 64;
        const auto ls = traced(a.max_blocks, [&] { flash::run_backward(bc, n, fmt, cd, b, nullptr); });
        int k = 0;
        for (const auto& l : ls) {
          if (l.kernel.find("BwdParams") == std::string::npos) {
            r->memory.push_back(l);
          } else {
            const bool dkdv = k++ == 0;
            r->compute.emplace_back(l, r == &hop ? kSm90Regs : dkdv ? dkdv_regs : dq_regs);
          }
        }
      }
      const double th = predict_compute_row(hop, g, p) / 1e3, tr = predict_compute_row(ref, g, p) / 1e3;
      const double th0 = predict_compute_row(hop, g, p0) / 1e3;
      char line[256];
      std::snprintf(line, sizeof line, "| %s | %.3f | %.3f | %.3f | %.3f | %.2f |", shape, th, th0, tr,
                    m.bwd[0], tr / th);
      bwd_lines.push_back(line);
    }
  }
  std::printf("\n## sm_90 backward (dK/dV and dQ kernels): predicted (not measured), H200\n\n");
  std::printf("| shape | predicted ms (pipes add) | predicted ms (pipes overlap) | mma.sync backward "
              "predicted ms | measured ms | predicted speed-up |\n|---|---|---|---|---|---|\n");
  for (const std::string& l : bwd_lines) std::printf("%s\n", l.c_str());
  std::printf("\nratio = measured mma.sync (or torch) time / predicted sm_90 time: > 1 means the "
              "sm_90 kernel is predicted faster; the two figures are the pipes-add and "
              "pipes-overlap predictions\n");
  if (csv) std::fclose(csv);
}

int run(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--max-blocks" && i + 1 < argc) a.max_blocks = std::stoull(argv[++i]);
    else if (s == "--csv" && i + 1 < argc) a.csv = argv[++i];
    else if (s == "--refit") a.refit = true;
    else if (s == "--launches") a.launches = true;
    else if (s == "--no-loo") a.loo = false;
    else if (s == "--only" && i + 1 < argc) a.only = argv[++i];
    else if (s == "--sm90") a.sm90 = true;
    else if (s == "--sm90-csv" && i + 1 < argc) a.sm90 = true, a.sm90_csv = argv[++i];
    else throw std::runtime_error("usage: simt_attention_cost [--max-blocks N] [--csv FILE] [--refit] [--launches] [--no-loo] [--only flash|baseline] [--sm90] [--sm90-csv FILE]");
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<ComputeRow> rows = build_rows(a);
  const double emu_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Gpu g;
  ComputeParams p = h200_attention_calibration();
  if (a.refit) p = fit_compute(rows, g, -1, p);
  std::printf("simt_attention_cost: %zu rows, max_blocks %llu, emulation %.1f s\n", rows.size(),
              static_cast<unsigned long long>(a.max_blocks), emu_s);
  std::printf("parameters%s: e_tensor %.9g alu_per_exp %.9g alu_per_mma %.9g overlap %.9g "
              "barrier_clk %.9g block_clk %.9g gemm_tflops %.9g k_fp64 %.9g mem_block_clk %.9g "
              "(t_launch_us %.3g fixed)\n",
              a.refit ? " (refitted)" : " (h200_attention_calibration)", p.e_tensor,
              p.alu_per_exp, p.alu_per_mma, p.overlap, p.barrier_clk, p.block_clk, p.gemm_tflops,
              p.k_fp64, p.mem_block_clk, p.t_launch_us);
  std::printf("\n| row | shape | measured ms | predicted ms | error | leave-one-out | bound |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::FILE* csv = a.csv.empty() ? nullptr : std::fopen(a.csv.c_str(), "w");
  if (!a.csv.empty() && !csv) throw std::runtime_error("cannot write " + a.csv);
  if (csv) std::fprintf(csv, "row,shape,measured_ms,predicted_ms,error,loo_predicted_ms,loo_error,bound\n");
  // leave-one-out: each row's prediction with the parameters fitted without it (from the
  // calibration, small steps), on two threads
  std::vector<double> loo(rows.size());
  {
    auto part = [&](size_t first) {
      for (size_t i = first; i < rows.size(); i += 2) {
        const ComputeParams q = a.loo ? fit_compute(rows, g, static_cast<int>(i), p, 1.1) : p;
        loo[i] = predict_compute_row(rows[i], g, q);
      }
    };
    std::thread other(part, 1);
    part(0);
    other.join();
  }
  int within = 0, within_loo = 0, n = 0;
  double worst = 0, worst_loo = 0;
  std::string worst_row, worst_loo_row;
  for (size_t i = 0; i < rows.size(); ++i) {
    const ComputeRow& r = rows[i];
    const double pred = predict_compute_row(r, g, p);
    const double err = pred / r.measured_us - 1, errl = loo[i] / r.measured_us - 1;
    std::string bound;
    for (const auto& [l, regs] : r.compute) {
      const ComputeTerms k = predict_attention_kernel(l, g, p, regs);
      bound += (bound.empty() ? "" : "+") + std::string(k.bound);
    }
    ++n;
    within += std::fabs(err) <= 0.25;
    within_loo += std::fabs(errl) <= 0.25;
    if (std::fabs(err) > worst) worst = std::fabs(err), worst_row = r.name + " " + r.shape;
    if (std::fabs(errl) > worst_loo) worst_loo = std::fabs(errl), worst_loo_row = r.name + " " + r.shape;
    std::printf("| %s | %s | %.3f | %.3f | %+.1f%% | %+.1f%% | %s |\n", r.name.c_str(),
                r.shape.c_str(), r.measured_us / 1e3, pred / 1e3, 100 * err, 100 * errl,
                bound.c_str());
    if (csv)
      std::fprintf(csv, "%s,%s,%.4f,%.4f,%.4f,%.4f,%.4f,%s\n", r.name.c_str(), r.shape.c_str(),
                   r.measured_us / 1e3, pred / 1e3, err, loo[i] / 1e3, errl, bound.c_str());
    std::fflush(stdout);
  }
  std::printf("\nwithin +-25%%: %d of %d rows (worst %+.1f%%: %s); leave-one-out: %d of %d (worst "
              "%.1f%%: %s)\n",
              within, n, 100 * worst, worst_row.c_str(), within_loo, n, 100 * worst_loo,
              worst_loo_row.c_str());
  if (a.launches) {
    std::printf("\nper launch (us; pipes = the grid's busy time spread over the SMs):\n");
    std::printf("| row | shape | kernel | regs | blocks/SM | tensor | mufu | alu | smem | "
                "barrier | makespan | imbalance |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const ComputeRow& r : rows) {
      for (const auto& [l, regs] : r.compute) {
        const ComputeTerms k = predict_attention_kernel(l, g, p, regs);
        std::printf("| %s | %s | %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.3f |\n",
                    r.name.c_str(), r.shape.c_str(), l.kernel.substr(0, 40).c_str(), regs,
                    k.blocks_per_sm, k.t_tensor, k.t_mufu, k.t_alu, k.t_smem, k.t_barrier,
                    k.makespan_us, k.imbalance);
      }
    }
  }
  if (a.launches) {
    std::printf("\nmemory-bound launches (predict_kernel, h200_calibration(); us) and GEMMs:\n");
    std::printf("| row | shape | kernel | DRAM MB | t_dram | t_issue | t_latency | t_math | t |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
    const Params mp = h200_calibration();
    const MathCost mc = sm90_math_cost();
    for (const ComputeRow& r : rows) {
      for (const auto& l : r.memory) {
        const KernelTerms k = predict_kernel(l, g, mp, mc);
        std::printf("| %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", r.name.c_str(),
                    r.shape.c_str(), l.kernel.substr(0, 40).c_str(), k.dram_bytes / 1e6, k.t_dram,
                    k.t_issue, k.t_latency, k.t_math, k.t);
      }
      for (const auto& [flop, bytes] : r.gemms)
        std::printf("| %s | %s | cuBLASLt GEMM | %.1f | %.1f | | | %.1f (FLOPs) | %.1f |\n",
                    r.name.c_str(), r.shape.c_str(), bytes / 1e6, bytes / (g.copy_gbs * 1e3),
                    flop / (p.gemm_tflops * 1e6),
                    p.t_launch_us + std::max(flop / (p.gemm_tflops * 1e6), bytes / (g.copy_gbs * 1e3)));
    }
  }
  if (csv) std::fclose(csv);
  if (a.sm90) sm90_predictions(a, g, p);
  return 0;
}

}  // namespace
}  // namespace st::cost

int main(int argc, char** argv) {
  return st::cost::tool_main("simt_attention_cost", st::cost::run, argc, argv);
}
