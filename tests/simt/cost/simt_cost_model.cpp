// simt_cost_model: the cost model of memory-bound kernels (cost_model.h), calibrated on the
// H200 figures of `bench_gpu kernels` and run on the CPU. Each benchmark row's kernels run
// in the SIMT emulator at the benchmark's shapes (GPT-2 124M, B*T = 8192, BF16; a sample of
// each launch's blocks, spread evenly over its grid), counting global-memory sectors per
// warp request; the model turns the counts into microseconds. Prints, per row, measured and
// predicted times, the fitted parameters, and each row's error when the row itself is left
// out of the fit (leave-one-out: the error to expect on a kernel the fit has not seen).
// Rows without a measurement are predictions for kernels no GPU has run yet.
//
//   simt_cost_model [--max-blocks N] [--csv FILE] [--launches]
// --launches adds, under the table, every launch's terms (DRAM, requests, latency, math).
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "simt/cost/cost_model.h"
#include "simt/cost/emu_run.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "simt/simt.h"

namespace st::cost {
namespace {

std::string shape_of(std::initializer_list<long long> dims) {
  std::string s;
  for (long long d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

// The rows of bench_gpu kernels (apps/bench_gpu.cu, run_kernels), with the times measured
// on an H200 on 2026-11-27 (bench/results/2026-11-27_gpu_speed_h200.md, call 1), and rows
// for kernels not yet measured.
std::vector<Row> build_rows(uint64_t mb) {
  const long long B = 8, T = 1024, N = B * T, C = 768, V = 50257, Vp = 50304;
  const long long P = 124475904;
  const DType bf = DType::BF16;
  std::vector<Row> rows;
  // whole: every block runs (a launch whose later launches read what it wrote, like the
  // passes of a sort, cannot be sampled)
  auto add = [&](const std::string& name, const std::string& shape, double us,
                 const std::function<void()>& launch, bool whole = false) -> Row& {
    Row r;
    r.name = name;
    r.shape = shape;
    r.measured_us = us;
    if (launch) r.launches = traced(whole ? 0 : mb, launch);
    rows.push_back(std::move(r));
    return rows.back();
  };
  auto tokens_of = [&](long long n, uint64_t seed) {
    auto t = std::make_shared<Mem>(n * 4);
    Rng rng(seed);
    for (long long i = 0; i < n; ++i) t->as<int32_t>()[i] = static_cast<int32_t>(rng.below(V));
    return t;
  };
  {  // encoder
    for (long long b : {B, 64LL}) {
      const long long n = b * T;
      auto tok = tokens_of(n, 7);
      Mem wte(Vp * C * 2), wpe(T * C * 2), out(n * C * 2), scr(cudak::encoder_backward_scratch(n) * 4);
      const std::string shape = shape_of({b, T, C});
      Row& f = add(b == B ? "encoder_forward" : "encoder_forward (B=64)", shape, b == B ? 23.1 : 0,
                   [&] {
                     cudak::encoder_forward(out.p, tok->as<int32_t>(), wte.p, wpe.p, b, T, C, bf,
                                            nullptr);
                   });
      f.uploads = 1;
      Row& k = add(b == B ? "encoder_backward (device sort)" : "encoder_backward (device sort, B=64)",
                   shape, 0, [&] {
                     cudak::encoder_backward(wte.p, wpe.p, out.p, tok->as<int32_t>(), b, T, C,
                                             static_cast<int>(Vp), bf, scr.as<int32_t>(), nullptr);
                   },
                   true);
      k.uploads = 1;
    }
    Row& old = add("encoder_backward (host sort incl.)", shape_of({B, T, C}), 653.6, nullptr);
    old.excluded = "the replaced host path: std::stable_sort of 8192 positions on the host";
  }
  {  // layernorm, residual
    Mem inp(N * C * 2), out(N * C * 2), w(C * 2), b(C * 2), mean(N * 4), rstd(N * 4), dinp(N * C * 2),
        dout(N * C * 2), dw(C * 2), db(C * 2), scr(cudak::layernorm_backward_scratch(N, C) * 4);
    add("layernorm_forward", shape_of({N, C}), 14.7, [&] {
      cudak::layernorm_forward(out.p, mean.as<float>(), rstd.as<float>(), inp.p, w.p, b.p, N, C, bf,
                               nullptr);
    });
    Row& lb = add("layernorm_backward", shape_of({N, C}), 42.7, [&] {
      cudak::layernorm_backward(dinp.p, dw.p, db.p, nullptr, dout.p, inp.p, w.p, mean.as<float>(),
                                rstd.as<float>(), N, C, bf, scr.as<float>(), nullptr);
    });
    lb.excluded = "changed since the H200 measured it: dinp and the dweight/dbias partials are "
                  "one kernel, a block per 64-row chunk (the 42.7 us are of the two-kernel version "
                  "with 2-byte partials, predicted then 49.3 us; its 16-byte-partial successor "
                  "measured 58.3 us on 2026-11-28, predicted 30.7)";
    add("residual_forward", shape_of({N, C}), 10.9,
        [&] { cudak::residual_forward(out.p, inp.p, dinp.p, N * C, bf, nullptr); });
    // not measured yet: the pair above (10.9 + 14.7 us measured) as one kernel
    Mem res(N * C * 2);
    add("residual + layernorm_forward (fused)", shape_of({N, C}), 0, [&] {
      cudak::residual_layernorm_forward(res.p, out.p, mean.as<float>(), rstd.as<float>(), inp.p,
                                        dinp.p, w.p, b.p, N, C, bf, nullptr);
    });
  }
  {  // the same pair at B = 64 (the step of bench train), unfused and fused: predictions
    const long long N64 = 64 * T;
    Mem inp(N64 * C * 2), d(N64 * C * 2), out(N64 * C * 2), res(N64 * C * 2), w(C * 2), b(C * 2),
        mean(N64 * 4), rstd(N64 * 4);
    add("residual_forward (B=64)", shape_of({N64, C}), 0,
        [&] { cudak::residual_forward(res.p, inp.p, d.p, N64 * C, bf, nullptr); });
    add("layernorm_forward (B=64)", shape_of({N64, C}), 0, [&] {
      cudak::layernorm_forward(out.p, mean.as<float>(), rstd.as<float>(), res.p, w.p, b.p, N64, C,
                               bf, nullptr);
    });
    add("residual + layernorm_forward (fused, B=64)", shape_of({N64, C}), 0, [&] {
      cudak::residual_layernorm_forward(res.p, out.p, mean.as<float>(), rstd.as<float>(), inp.p,
                                        d.p, w.p, b.p, N64, C, bf, nullptr);
    });
    Mem dinp(N64 * C * 2), dw(C * 2), db(C * 2), scr(cudak::layernorm_backward_scratch(N64, C) * 4);
    add("layernorm_backward (B=64)", shape_of({N64, C}), 0, [&] {
      cudak::layernorm_backward(dinp.p, dw.p, db.p, nullptr, d.p, res.p, w.p, mean.as<float>(),
                                rstd.as<float>(), N64, C, bf, scr.as<float>(), nullptr);
    });
    // with the next projection's dbias made in the same pass (replaces the pair
    // layernorm_backward + colsum dbias OC = 768)
    Mem dn(C * 2);
    add("layernorm_backward + dbias (B=64)", shape_of({N64, C}), 0, [&] {
      cudak::layernorm_backward(dinp.p, dw.p, db.p, dn.p, d.p, res.p, w.p, mean.as<float>(),
                                rstd.as<float>(), N64, C, bf, scr.as<float>(), nullptr);
    });
  }
  {  // dbias of the four biased matmul backwards per layer (colsum_accumulate, reduce.cu), B = 64
    const long long N64 = 64 * T;
    Mem d(N64 * 4 * C * 2), db(4 * C * 2), scr(cudak::colsum_scratch(N64, 4 * C) * 4);
    for (long long oc : {3 * C, C, 4 * C}) {
      add("colsum dbias (B=64, OC=" + std::to_string(oc) + ")", shape_of({N64, oc}), 0, [&] {
        cudak::colsum_accumulate(db.p, d.p, N64, oc, bf, scr.as<float>(), nullptr);
      });
    }
  }
  {  // gelu, cross-entropy at B = 64 (for the step's families: predictions)
    const long long N64 = 64 * T;
    Mem x(N64 * 4 * C * 2), y(N64 * 4 * C * 2);
    add("gelu_forward (B=64)", shape_of({N64, 4 * C}), 0,
        [&] { cudak::gelu_forward(y.p, x.p, N64 * 4 * C, bf, nullptr); });
    add("gelu_backward (in place, B=64)", shape_of({N64, 4 * C}), 0,
        [&] { cudak::gelu_backward(y.p, x.p, y.p, N64 * 4 * C, bf, nullptr); });
    // gelu_backward with the fc dbias column sums in the same pass (replaces the pair
    // gelu_backward + colsum dbias OC = 3072)
    Mem db(4 * C * 2), scr(cudak::colsum_scratch(N64, 4 * C) * 4);
    add("gelu_backward + dbias (in place, B=64)", shape_of({N64, 4 * C}), 0, [&] {
      cudak::gelu_backward_dbias(y.p, db.p, x.p, y.p, N64, 4 * C, bf, scr.as<float>(), nullptr);
    });
    Mem logits(N64 * Vp * 2), losses(N64 * 4);
    auto tgt = tokens_of(N64, 9);
    Row& f = add("crossentropy forward only (B=64)", shape_of({N64, Vp}), 0, [&] {
      cudak::crossentropy(losses.as<float>(), nullptr, logits.p, tgt->as<int32_t>(), N64, V, Vp,
                          0.0f, bf, nullptr);
    });
    f.uploads = 1;
    Row& fb = add("crossentropy fwd+bwd (in place, B=64)", shape_of({N64, Vp}), 0, [&] {
      cudak::crossentropy(losses.as<float>(), logits.p, logits.p, tgt->as<int32_t>(), N64, V, Vp,
                          1.0f / N64, bf, nullptr);
    });
    fb.uploads = 1;
  }
  {  // gelu
    Mem x(N * 4 * C * 2), y(N * 4 * C * 2), d(N * 4 * C * 2);
    add("gelu_forward", shape_of({N, 4 * C}), 37.8,
        [&] { cudak::gelu_forward(y.p, x.p, N * 4 * C, bf, nullptr); });
    add("gelu_backward (in place)", shape_of({N, 4 * C}), 50.6,
        [&] { cudak::gelu_backward(d.p, x.p, d.p, N * 4 * C, bf, nullptr); });
    Mem db(4 * C * 2), scr(cudak::colsum_scratch(N, 4 * C) * 4);
    add("gelu_backward + dbias (in place)", shape_of({N, 4 * C}), 0, [&] {
      cudak::gelu_backward_dbias(d.p, db.p, x.p, d.p, N, 4 * C, bf, scr.as<float>(), nullptr);
    });
  }
  {  // cross-entropy
    Mem logits(N * Vp * 2), losses(N * 4);
    auto tgt = tokens_of(N, 8);
    Row& f = add("crossentropy forward only", shape_of({N, Vp}), 505.2, [&] {
      cudak::crossentropy(losses.as<float>(), nullptr, logits.p, tgt->as<int32_t>(), N, V, Vp, 0.0f,
                          bf, nullptr);
    });
    f.uploads = 1;
    Row& fb = add("crossentropy fwd+bwd (in place)", shape_of({N, Vp}), 972.8, [&] {
      cudak::crossentropy(losses.as<float>(), logits.p, logits.p, tgt->as<int32_t>(), N, V, Vp,
                          1.0f / N, bf, nullptr);
    });
    fb.uploads = 1;
  }
  {  // optimizer-sized kernels
    Mem grad(P * 2), master(P * 4), m(P * 4), v(P * 4), param(P * 2),
        scr((cudak::sum_squares_scratch(P) + 1) * 8), flag(4);
    Row& ss = add("sum_squares (grad norm)", std::to_string(P), 111.9, [&] {
      auto* part = scr.as<double>();
      cudak::sum_squares(part + cudak::sum_squares_scratch(P), grad.p, P, bf, part, nullptr);
    });
    ss.fetches = 1;
    Row& af = add("all_finite", std::to_string(P), 205.6,
                  [&] { cudak::any_nonfinite(flag.as<int>(), grad.p, P, bf, nullptr); });
    af.memsets = 1;
    af.fetches = 1;
    const cudak::AdamWScalars s = cudak::adamw_scalars(1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f);
    Row& aw = add("adamw_update", std::to_string(P), 1053.0, [&] {
      cudak::adamw(master.as<float>(), param.p, grad.p, m.as<float>(), v.as<float>(), P, s, bf,
                   false, 0, 10, 0, nullptr);
    });
    aw.excluded = "changed since the H200 measured it: 4 elements per thread (16-byte loads of "
                  "master, m, v) instead of one (the 1053.0 us are of the one-element kernel, "
                  "predicted then 977.9 us, request-bound)";
    add("round_copy fp32 -> bf16", std::to_string(P), 180.3,
        [&] { cuda_convert(param.p, bf, master.p, DType::F32, P, nullptr); });
    Row& z = add("zero", std::to_string(P), 61.5, nullptr);
    z.driver_bytes = P * 2.0;
    Row& c = add("copy bf16 device to device", std::to_string(P), 124.1, nullptr);
    c.driver_bytes = 2.0 * P * 2.0;
  }
  return rows;
}

int run(int argc, char** argv) {
  uint64_t max_blocks = 64;
  std::string csv;
  bool launches = false, refit = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--refit") {
      refit = true;
    } else if (a == "--max-blocks" && i + 1 < argc) {
      max_blocks = std::stoull(argv[++i]);
    } else if (a == "--launches") {
      launches = true;
    } else if (a == "--csv" && i + 1 < argc) {
      csv = argv[++i];
    } else {
      std::fprintf(stderr, "usage: simt_cost_model [--refit] [--max-blocks N] [--csv FILE] [--launches]\n");
      return 2;
    }
  }
  const Gpu g;
  const MathCost m = sm90_math_cost();
  const std::vector<Row> rows = build_rows(max_blocks);
  const Params p = refit ? fit(rows, g, m) : h200_calibration();
  std::printf(
      "H200 model (%d SMs, %.2f GHz, copy %.0f GB/s), %s: t_launch %.2f us, "
      "round latency %.3f us, U = %d loads in flight, waves^%.3f, overlap %.3f, %.0f requests/us/SM, "
      "k_math %.3f, upload %.2f us, fetch %.2f us\n"
      "(full precision: %.9g %.9g %d %.9g %.9g %.9g %.9g %.9g %.9g)\n"
      "emulated: at most %llu blocks of each launch\n\n",
      g.sms, g.clock_ghz, g.copy_gbs,
      refit ? "fitted now to the rows in the fit" : "the 2026-11-28 calibration (h200_calibration)",
      p.t_launch_us, p.latency_us, 1 << p.u_log2, p.wave_exp, p.overlap, p.req_per_us, p.k_math,
      p.t_upload_us, p.t_fetch_us, p.t_launch_us, p.latency_us, p.u_log2, p.wave_exp, p.overlap,
      p.req_per_us, p.k_math, p.t_upload_us, p.t_fetch_us,
      static_cast<unsigned long long>(max_blocks));
  std::printf("| %-38s | %-14s | %9s | %9s | %7s | %7s | %9s | %7s | %6s | %-8s |\n", "row (bf16)",
              "shape", "measured", "predicted", "error", "LOO err", "DRAM MB", "coalesc", "rounds",
              "bound");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(40, '-').c_str(),
              std::string(16, '-').c_str(), std::string(11, '-').c_str(),
              std::string(11, '-').c_str(), std::string(9, '-').c_str(),
              std::string(9, '-').c_str(), std::string(11, '-').c_str(),
              std::string(9, '-').c_str(), std::string(8, '-').c_str(),
              std::string(10, '-').c_str());
  FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (!csv.empty() && !out) {
    std::fprintf(stderr, "simt_cost_model: cannot write %s\n", csv.c_str());
    return 1;
  }
  if (out)
    std::fprintf(out, "row,shape,measured_us,predicted_us,error,loo_error,dram_bytes,coalescing,"
                      "rounds,bound,excluded\n");
  double worst = 0, worst_loo = 0;
  int fitted = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const bool in_fit = r.measured_us > 0 && r.excluded.empty();
    double pred = predict_row(r, g, p, m);
    double dram = r.driver_bytes, coal = 0, lat = 0, bw = r.driver_bytes / (g.copy_gbs * 1e3),
           issue = 0;
    uint64_t rounds = 0;
    double asked = 0, touched = 0;
    for (const auto& l : r.launches) {
      const KernelTerms k = predict_kernel(l, g, p, m);
      dram += k.dram_bytes;
      lat += k.t_latency;
      bw += k.t_dram;
      issue += k.t_issue;
      rounds = std::max(rounds, k.rounds);
      asked += static_cast<double>(l.bytes_rd + l.bytes_wr);
      touched += 32.0 * static_cast<double>(l.sectors_rd + l.sectors_wr);
    }
    coal = touched > 0 ? asked / touched : 1.0;
    std::string err = "-", loo = "-";
    double e = 0, el = 0;
    if (r.measured_us > 0 && !r.excluded.empty() && !r.launches.empty()) {
      char b[32];  // a measurement of an earlier version: shown, not an error of the model
      std::snprintf(b, sizeof b, "(%+.0f%%)", 100 * (pred / r.measured_us - 1));
      err = b;
    }
    if (r.measured_us > 0 && r.excluded.empty()) {
      e = pred / r.measured_us - 1;
      const Params pl = fit(rows, g, m, static_cast<int>(i));
      el = predict_row(r, g, pl, m) / r.measured_us - 1;
      char b[32];
      std::snprintf(b, sizeof b, "%+.1f%%", 100 * e);
      err = b;
      std::snprintf(b, sizeof b, "%+.1f%%", 100 * el);
      loo = b;
      worst = std::max(worst, std::fabs(e));
      worst_loo = std::max(worst_loo, std::fabs(el));
      ++fitted;
    }
    const char* bound = r.launches.empty()              ? "copy"
                        : lat > std::max(bw, issue)     ? "latency"
                        : issue > bw                    ? "requests"
                                                        : "DRAM";
    char meas[32];
    std::snprintf(meas, sizeof meas, r.measured_us > 0 ? "%.1f" : "-", r.measured_us);
    std::printf("| %-38s | %-14s | %9s | %9.1f | %7s | %7s | %9.1f | %7.2f | %6llu | %-8s |\n",
                r.name.c_str(), r.shape.c_str(), meas, pred, err.c_str(),
                r.excluded.empty() ? loo.c_str() : "excl.", dram / 1e6, coal,
                static_cast<unsigned long long>(rounds), bound);
    if (out)
      std::fprintf(out, "\"%s\",%s,%g,%.3f,%s,%s,%.0f,%.4f,%llu,%s,\"%s\"\n", r.name.c_str(),
                   r.shape.c_str(),
                   r.measured_us, pred, in_fit ? std::to_string(e).c_str() : "",
                   in_fit ? std::to_string(el).c_str() : "", dram, coal,
                   static_cast<unsigned long long>(rounds), bound, r.excluded.c_str());
  }
  if (out) std::fclose(out);
  if (launches) {
    std::printf("\n| row | kernel | grid | block | blocks/SM | waves | rounds | DRAM us | issue us | "
                "latency us | math us | total us |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows) {
      for (const auto& l : r.launches) {
        const KernelTerms k = predict_kernel(l, g, p, m);
        std::printf("| %s | %s | %llu | %u | %d | %.0f | %llu | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                    r.name.c_str(), l.kernel.c_str(),
                    static_cast<unsigned long long>(l.blocks_total), l.threads_per_block,
                    k.blocks_per_sm, k.waves, static_cast<unsigned long long>(k.rounds), k.t_dram,
                    k.t_issue, k.t_latency, k.t_math, k.t);
      }
    }
  }
  for (const Row& r : rows)
    if (!r.excluded.empty()) std::printf("\nexcluded: %s: %s\n", r.name.c_str(), r.excluded.c_str());
  // Out of sample: the kernel families of bench train's GPT-2 124M step at B = 64 (flash
  // attention, a pass synchronized after every call, H200, 2026-11-27: the per-family table
  // of bench/results/2026-11-27_gpu_speed_h200.md), from the B = 64 rows (the fit saw B = 8
  // only). Each measured call also carries one host synchronization, which the prediction
  // leaves out.
  auto pred_of = [&](const std::string& name) {
    for (const Row& r : rows)
      if (r.name == name) return predict_row(r, g, p, m);
    throw std::runtime_error("simt_cost_model: no row " + name);
  };
  struct Family {
    const char* name;
    double measured_ms;  // 2026-11-27, the kernels of f8b7fb4; < 0: not a family then
    int calls;           // calls per step measured
    std::vector<std::pair<const char*, int>> parts;  // row of this tree, calls per step
  };
  // The memory-bound kernels of this tree's step (GPT2::forward_backward, 12 layers).
  const std::vector<Family> fam = {
      // one classifier pass per micro-batch; the step measured ran two (a loss-only pass in
      // forward(), the loss+dlogits pass in backward())
      {"crossentropy", 10.40, 2, {{"crossentropy fwd+bwd (in place, B=64)", 1}}},
      // now: ln1 of layer 0 alone, the other 24 forwards fused with their residual add (the
      // residual family measured 1.93 ms then); 24 of the 25 backwards also make a
      // projection's dbias (attproj, fcproj: from the matmul family then)
      {"layernorm", 8.27, 50,
       {{"layernorm_forward (B=64)", 1},
        {"residual + layernorm_forward (fused, B=64)", 24},
        {"layernorm_backward (B=64)", 1},
        {"layernorm_backward + dbias (B=64)", 24}}},
      {"residual", 1.93, 24, {}},
      // the backward also makes the fc dbias (from the matmul family then)
      {"gelu", 6.35, 24,
       {{"gelu_forward (B=64)", 12}, {"gelu_backward + dbias (in place, B=64)", 12}}},
      // the qkv dbias, still inside matmul_backward (part of the matmul family)
      {"matmul dbias (qkv)", -1, 12, {{"colsum dbias (B=64, OC=2304)", 12}}},
      {"encoder", 8.7, 2,
       {{"encoder_forward (B=64)", 1}, {"encoder_backward (device sort, B=64)", 1}}},
      {"adamw", 1.21, 16, {{"adamw_update", 1}}}};
  std::printf("\nbench train's step at B=64, memory-bound kernels: measured per family "
              "(flash step, synchronized pass, H200 2026-11-27, the kernels of f8b7fb4) and "
              "predicted for the kernels this tree's step runs (where they changed, the ratio "
              "is a prediction of the change, not a check)\n\n"
              "| family | calls/step then | measured ms then | rows now (calls) | predicted ms now "
              "| predicted / measured |\n|---|---|---|---|---|---|\n");
  double total = 0;
  for (const Family& f : fam) {
    double t = 0;
    std::string parts;
    for (const auto& [row, n] : f.parts) {
      t += n * pred_of(row);
      parts += (parts.empty() ? "" : ", ") + std::string(row) + " x" + std::to_string(n);
    }
    total += t;
    char meas[32] = "-", ratio[32] = "-";
    if (f.measured_ms >= 0) std::snprintf(meas, sizeof meas, "%.2f", f.measured_ms);
    if (f.measured_ms >= 0 && !f.parts.empty()) {
      std::snprintf(ratio, sizeof ratio, "%.2f", t / 1e3 / f.measured_ms);
    }
    std::printf("| %s | %d | %s | %s | %.2f | %s |\n", f.name, f.calls, meas,
                parts.empty() ? "(fused into layernorm)" : parts.c_str(), t / 1e3, ratio);
  }
  std::printf("\nthe step's memory-bound kernels now, predicted: %.2f ms\n", total / 1e3);
  std::printf("\n%d rows compared: largest error %.1f%%, largest leave-one-out error %.1f%% "
              "(acceptance: every row within 20%%)\n",
              fitted, 100 * worst, 100 * worst_loo);
  return 0;
}

}  // namespace
}  // namespace st::cost

int main(int argc, char** argv) {
  return st::cost::tool_main("simt_cost_model", st::cost::run, argc, argv);
}
