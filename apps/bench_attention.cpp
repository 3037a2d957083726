// bench attention: the CUDA attention backends on FlashAttention's benchmark shapes.
//   bench attention [--d 64,128] [--T 1024,2048,4096,8192,16384] [--reps 10] [--dtype bf16]
// Shapes as FlashAttention's benchmarks: B*T = 16384 tokens, H*d = 2048, causal.
// FLOPs: forward 4 B T^2 H d, halved when causal; backward 2.5x the forward (the FA
// convention; our deterministic backward really does ~1.4x FA2's backward work, see
// cuda/flash_bwd.cuh, but the TFLOP/s use the common count so they compare across
// implementations).
// Prints markdown tables (lines starting with '|') and "device: <name>":
//   1. speed: fwd, bwd, fwd+bwd time and TFLOP/s of flash, stabilized_flash and baseline
//      (baseline where it runs: an error such as "not implemented" or out of memory is
//      printed and the benchmark goes on);
//   2. stabilized / flash speed ratios;
//   3. peak attention memory vs T: memory().peak during one forward + backward on a fresh
//      Attention object, minus what was in use before (the inputs, outputs and gradients);
//   4. delta modes: backward time per mode, and the mean signed error of the backward's delta
//      against FP64 on tied-maximum inputs (Qiu & Yao rows, the construction of
//      attention/experiments.cpp), with the accumulator in FP32 (the GPU default) and in the
//      compute format (the paper's);
//   5. deviation from FP64: max and mean |error| of O, dQ, dK, dV of every GPU method
//      (cudnn included) and of the CPU's straightforward attention in the same format, against
//      the CPU's FP64 attention on the same format-exact inputs (N(0,1) q, k, v, dO; causal).
// apps/bench_torch_attention.py --ours FILE reads table 1 and compares with PyTorch's
// FlashAttention-2 (scaled_dot_product_attention with the FLASH_ATTENTION backend).
// Only the Backend / Attention interfaces are used, plus flash_cuda_last_delta
// (cuda/flash_attention.h) to read the delta back. Table 4 is bench_attention_delta.cpp's;
// what the two files share is in bench_attention.h.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "apps/bench_attention.h"
#if defined(ST_WITH_CUDA)
#include "cuda/attention_cuda.h"
#endif

namespace st {
namespace attn_bench {
namespace {

template <class F>
double median_ms(Backend& be, int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    be.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.synchronize();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

void tiles_for(const AttnBenchArgs& a, int d, int& bq, int& bk) {
  if (a.tiles == "auto") {
    bq = 128;
    bk = d <= 64 ? 128 : 64;
    return;
  }
  const auto x = a.tiles.find('x');
  ST_CHECK(x != std::string::npos, "bench attention: --tiles must be auto or QxK, got ", a.tiles);
  bq = std::stoi(a.tiles.substr(0, x));
  bk = std::stoi(a.tiles.substr(x + 1));
}

double fwd_flops(int B, int T, int H, int d, bool causal) {
  return 4.0 * B * static_cast<double>(T) * T * H * d / (causal ? 2.0 : 1.0);
}

Timing time_method(Backend& be, const AttentionConfig& cfg, Problem& p, DType fmt,
                   const AttnBenchArgs& a) {
  Timing r;
  try {
    auto attn = be.make_attention(cfg);
    auto fwd = [&] { attn->forward(p.out, p.lse, p.qkv, p.H, fmt); };
    auto bwd = [&] { attn->backward(p.dqkv, p.dout, p.qkv, p.out, p.lse, p.H, fmt); };
    for (int i = 0; i < a.warmup; ++i) {
      fwd();
      bwd();
    }
    be.synchronize();
    r.fwd = median_ms(be, a.reps, fwd);
    fwd();
    r.bwd = median_ms(be, a.reps, bwd);
    r.both = median_ms(be, a.reps, [&] {
      fwd();
      bwd();
    });
    r.ok = true;
  } catch (const std::exception& e) {
    r.error = e.what();
    try {
      be.synchronize();
    } catch (...) {
    }
  }
  return r;
}

std::string fmt_num(double x, const char* f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

}  // namespace attn_bench

namespace {
using namespace attn_bench;

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) r.push_back(std::stoi(item));
  return r;
}
std::vector<std::string> parse_list(const std::string& s) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) r.push_back(item);
  return r;
}

// A method's configuration: an attention kind, or a flash kind + "_sm90" (the Hopper forward
// kernel, attention.cuda_kernel: sm90, tiles 128x128).
AttentionConfig method_config(const std::string& m, bool* sm90_out = nullptr) {
  AttentionConfig cfg;
  const bool sm90 = m.size() > 5 && m.compare(m.size() - 5, 5, "_sm90") == 0;
  cfg.kind = parse_attention_kind(sm90 ? m.substr(0, m.size() - 5) : m);
  cfg.causal = true;
  if (sm90) {
    cfg.cuda_kernel = FlashKernel::Sm90;
    cfg.block_q = cfg.block_k = 128;
  }
  if (sm90_out) *sm90_out = sm90;
  return cfg;
}

// Extra device memory of one forward + backward on a fresh Attention: peak minus the bytes
// in use before (inputs, outputs, gradients). -1 on an error.
double attention_mib(Backend& be, const AttentionConfig& cfg, Problem& p, DType fmt) {
  try {
    be.synchronize();
    const size_t base = be.memory().in_use;
    be.reset_peak_memory();
    {
      auto attn = be.make_attention(cfg);
      attn->forward(p.out, p.lse, p.qkv, p.H, fmt);
      attn->backward(p.dqkv, p.dout, p.qkv, p.out, p.lse, p.H, fmt);
      be.synchronize();
    }
    const size_t peak = be.memory().peak;
    return peak > base ? static_cast<double>(peak - base) / (1024.0 * 1024.0) : 0.0;
  } catch (const std::exception&) {
    try {
      be.synchronize();
    } catch (...) {
    }
    return -1;
  }
}

// Table 5: every method's deviation from FP64 on the same inputs (see the header).
void deviation_table(Backend& be, const AttnBenchArgs& a, DType fmt,
                     const std::vector<std::string>& methods) {
  struct Shape {
    int B, T, H, d;
  };
  const Shape shapes[] = {{2, 1000, 4, 64}, {1, 1000, 2, 128}};
  auto cpu = make_cpu_backend();
  std::printf("\n## Deviation from FP64 (max |err| / mean |err|; N(0,1) inputs rounded to %s, "
              "causal; reference: the CPU's attention in FP64 on the same inputs)\n\n",
              dtype_name(fmt));
  std::printf("| d | T | B | H | method | O max | O mean | dQ max | dQ mean | dK max | dK mean | "
              "dV max | dV mean |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const std::vector<int> ds = parse_ints(a.ds);
  for (const Shape& sh : shapes) {
    if (std::find(ds.begin(), ds.end(), sh.d) == ds.end()) continue;
    const int C = sh.H * sh.d;
    Tensor qkv = Tensor::empty({sh.B, sh.T, 3 * C}, DType::F32),
           dout = Tensor::empty({sh.B, sh.T, C}, DType::F32);
    Rng rng(4242 + sh.d);
    for (int64_t i = 0; i < qkv.numel(); ++i)
      qkv.data<float>()[i] = round_to(fmt, static_cast<float>(rng.normal()));
    for (int64_t i = 0; i < dout.numel(); ++i)
      dout.data<float>()[i] = round_to(fmt, static_cast<float>(rng.normal()));
    // The FP64 reference and the CPU's straightforward attention in fmt.
    auto widen = [](const Tensor& t) {
      Tensor w = Tensor::empty(t.shape(), DType::F64);
      for (int64_t i = 0; i < t.numel(); ++i) w.data<double>()[i] = t.data<float>()[i];
      return w;
    };
    AttentionConfig base;
    base.causal = true;
    struct Result {
      std::vector<double> o, dqkv;
    };
    auto run_cpu = [&](DType f) {
      auto attn = cpu->make_attention(base);
      const DType st = f == DType::F64 ? DType::F64 : DType::F32;
      Tensor q = f == DType::F64 ? widen(qkv) : qkv, g = f == DType::F64 ? widen(dout) : dout;
      Tensor o = Tensor::empty({sh.B, sh.T, C}, st), l = Tensor::empty({sh.B, sh.H, sh.T}, st),
             dq = Tensor::empty({sh.B, sh.T, 3 * C}, st);
      attn->forward(o, l, q, sh.H, f);
      attn->backward(dq, g, q, o, l, sh.H, f);
      Result r;
      for (const Tensor* t : {&o, &dq}) {
        std::vector<double>& v = t == &o ? r.o : r.dqkv;
        for (int64_t i = 0; i < t->numel(); ++i)
          v.push_back(st == DType::F64 ? t->data<double>()[i] : t->data<float>()[i]);
      }
      return r;
    };
    const Result ref = run_cpu(DType::F64);
    auto row = [&](const std::string& name, const Result& r) {
      std::printf("| %d | %d | %d | %d | %s |", sh.d, sh.T, sh.B, sh.H, name.c_str());
      for (int part = -1; part < 3; ++part) {
        double mx = 0, sum = 0;
        size_t n = 0;
        const std::vector<double>& x = part < 0 ? r.o : r.dqkv;
        const std::vector<double>& y = part < 0 ? ref.o : ref.dqkv;
        for (size_t i = 0; i < x.size(); ++i) {
          if (part >= 0 && static_cast<int>((i % (3 * C)) / C) != part) continue;
          const double e = std::fabs(x[i] - y[i]);
          mx = std::isfinite(e) ? std::max(mx, e) : INFINITY;
          sum += e;
          ++n;
        }
        std::printf(" %.3e | %.3e |", mx, sum / n);
      }
      std::printf("\n");
    };
    row(std::string("cpu baseline ") + dtype_name(fmt), run_cpu(fmt));
    for (const std::string& m : methods) {
      try {
        const AttentionConfig cfg = method_config(m);
        auto attn = be.make_attention(cfg);
        Tensor dq = be.alloc(qkv.shape(), fmt), dg = be.alloc(dout.shape(), fmt);
        be.copy(dq, qkv);
        be.copy(dg, dout);
        Tensor o = be.alloc({sh.B, sh.T, C}, fmt), l = be.alloc({sh.B, sh.H, sh.T}, DType::F32),
               dqkv = be.alloc(qkv.shape(), fmt);
        attn->forward(o, l, dq, sh.H, fmt);
        attn->backward(dqkv, dg, dq, o, l, sh.H, fmt);
        Result r;
        Tensor ho = Tensor::empty(o.shape(), DType::F64), hd = Tensor::empty(dqkv.shape(), DType::F64);
        be.copy(ho, o);
        be.copy(hd, dqkv);
        r.o.assign(ho.data<double>(), ho.data<double>() + ho.numel());
        r.dqkv.assign(hd.data<double>(), hd.data<double>() + hd.numel());
        row(m, r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench attention: deviation %s d=%d: %s\n", m.c_str(), sh.d, e.what());
        std::printf("| %d | %d | %d | %d | %s | - | - | - | - | - | - | - | - |\n", sh.d, sh.T,
                    sh.B, sh.H, m.c_str());
        try {
          be.synchronize();
        } catch (...) {
        }
      }
    }
  }
}

int run_attention_bench(const AttnBenchArgs& a) {
  const DType fmt = parse_dtype(a.dtype);
  auto be = make_cuda_backend(0);
  std::string dev = be->name();
  if (dev.rfind("cuda:", 0) == 0) dev = dev.substr(5);
  std::printf("device: %s\n", dev.c_str());
#if defined(ST_WITH_CUDA)
  std::printf("cudnn: %s\n", cudnn_version_text().c_str());
#endif
  std::printf("dtype: %s, causal, B*T = %d tokens, H*d = %d, reps %d (median)\n", dtype_name(fmt),
              a.tokens, a.width, a.reps);
  const std::vector<int> ds = parse_ints(a.ds), Ts = parse_ints(a.Ts);
  const std::vector<std::string> methods = parse_list(a.methods);

  struct Row {
    int d, T, B, H;
    std::string method, tiles;
    Timing t;
    double mib = -1;
  };
  std::vector<Row> rows;
  bool baseline_missing = false;
  for (int d : ds) {
    const int H = a.width / d;
    ST_CHECK(H * d == a.width, "bench attention: width ", a.width, " is not a multiple of d = ", d);
    // Inputs drawn once per head dim, viewed per T.
    const int64_t n3 = static_cast<int64_t>(a.tokens) * 3 * a.width;
    Tensor h_qkv = Tensor::empty({n3}, DType::F32), h_do = Tensor::empty({n3 / 3}, DType::F32);
    Rng rng(1234 + d);
    for (int64_t i = 0; i < n3; ++i) h_qkv.data<float>()[i] = static_cast<float>(rng.normal());
    for (int64_t i = 0; i < n3 / 3; ++i) h_do.data<float>()[i] = static_cast<float>(rng.normal());
    Tensor qkv = be->alloc({n3}, fmt), dout = be->alloc({n3 / 3}, fmt);
    be->copy(qkv, h_qkv);
    be->copy(dout, h_do);
    for (int T : Ts) {
      if (a.tokens % T != 0) continue;
      const int B = a.tokens / T;
      Problem p{B, T, H, d, qkv.view({B, T, 3 * a.width}), dout.view({B, T, a.width}), {}, {}, {}};
      p.out = be->alloc({B, T, a.width}, fmt);
      p.lse = be->alloc({B, H, T}, DType::F32);
      p.dqkv = be->alloc({B, T, 3 * a.width}, fmt);
      for (const std::string& m : methods) {
        bool sm90 = false;
        AttentionConfig cfg = method_config(m, &sm90);
        std::string tiles = "-";
        if (sm90) {
          tiles = "128x128";
        } else if (cfg.kind == AttentionKind::Cudnn) {
          tiles = "cuDNN's";
        } else if (cfg.kind != AttentionKind::Baseline) {
          tiles_for(a, d, cfg.block_q, cfg.block_k);
          tiles = std::to_string(cfg.block_q) + "x" + std::to_string(cfg.block_k);
        } else if (baseline_missing) {
          continue;
        }
        Row r{d, T, B, H, m, tiles, time_method(*be, cfg, p, fmt, a)};
        if (!r.t.ok) {
          std::fprintf(stderr, "bench attention: %s d=%d T=%d: %s\n", m.c_str(), d, T, r.t.error.c_str());
          if (cfg.kind == AttentionKind::Baseline &&
              r.t.error.find("not implemented") != std::string::npos) {
            baseline_missing = true;
            std::printf("note: baseline attention: %s\n", r.t.error.c_str());
          }
        }
        if (a.memory && r.t.ok) r.mib = attention_mib(*be, cfg, p, fmt);
        rows.push_back(r);
      }
    }
  }

  // 1. speed
  std::printf("\n## Attention speed (TFLOP/s: fwd 4 B T^2 H d / 2 causal, bwd 2.5x fwd)\n\n");
  std::printf("| d | T | B | H | method | tiles | fwd ms | bwd ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (!r.t.ok) {
      std::printf("| %d | %d | %d | %d | %s | %s | - | - | - | - | - | - |\n", r.d, r.T, r.B, r.H,
                  r.method.c_str(), r.tiles.c_str());
      continue;
    }
    const double f = fwd_flops(r.B, r.T, r.H, r.d, true);
    std::printf("| %d | %d | %d | %d | %s | %s | %.3f | %.3f | %.3f | %.1f | %.1f | %.1f |\n", r.d, r.T,
                r.B, r.H, r.method.c_str(), r.tiles.c_str(), r.t.fwd, r.t.bwd, r.t.both,
                f / (r.t.fwd * 1e9), 2.5 * f / (r.t.bwd * 1e9), 3.5 * f / (r.t.both * 1e9));
  }
  // 2. stabilized / flash
  std::printf("\n## Stabilized flash / flash time ratio (1.00 = no cost)\n\n");
  std::printf("| d | T | fwd | bwd | fwd+bwd |\n|---|---|---|---|---|\n");
  for (const char* kernel : {"", "_sm90"}) {
    for (const Row& s : rows) {
      if (s.method != std::string("stabilized_flash") + kernel || !s.t.ok) continue;
      for (const Row& f : rows)
        if (f.method == std::string("flash") + kernel && f.d == s.d && f.T == s.T && f.t.ok)
          std::printf("| %d | %d%s | %.3f | %.3f | %.3f |\n", s.d, s.T, kernel, s.t.fwd / f.t.fwd,
                      s.t.bwd / f.t.bwd, s.t.both / f.t.both);
    }
  }
  // sm_90 forward kernel / mma.sync forward kernel (same numerics; < 1 = faster)
  std::printf("\n## sm_90 kernel / mma.sync kernel time ratio (forward; < 1.00 = faster)\n\n");
  std::printf("| d | T | method | fwd | fwd+bwd |\n|---|---|---|---|---|\n");
  for (const Row& h : rows) {
    const size_t n = h.method.size();
    if (n <= 5 || h.method.compare(n - 5, 5, "_sm90") != 0 || !h.t.ok) continue;
    for (const Row& f : rows)
      if (f.method == h.method.substr(0, n - 5) && f.d == h.d && f.T == h.T && f.t.ok)
        std::printf("| %d | %d | %s | %.3f | %.3f |\n", h.d, h.T, f.method.c_str(),
                    h.t.fwd / f.t.fwd, h.t.both / f.t.both);
  }
  // 3. memory
  if (a.memory) {
    std::printf("\n## Peak attention memory of one forward + backward (MiB, beyond inputs/outputs)\n\n");
    std::printf("| d | T | method | MiB |\n|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf("| %d | %d | %s | %s |\n", r.d, r.T, r.method.c_str(),
                  r.mib >= 0 ? fmt_num(r.mib).c_str() : "-");
  }

  // 4. delta modes
  if (a.deltas) delta_mode_table(*be, a, fmt, ds.empty() ? 64 : ds.front());
  if (a.deviation) deviation_table(*be, a, fmt, methods);
  std::printf("\nnote: our backward is deterministic (no atomics; dQ in its own kernel); "
              "FlashAttention-2's backward adds dQ with atomics (non-deterministic).\n");
  return 0;
}

}  // namespace

CLI::App* add_attention_bench(CLI::App& app, int& rc) {
  auto args = std::make_shared<AttnBenchArgs>();
  auto* sub = app.add_subcommand(
      "attention", "CUDA attention TFLOP/s, memory, delta-mode accuracy and deviation from FP64");
  sub->add_option("--d", args->ds, "head dims, comma-separated")->capture_default_str();
  sub->add_option("--T", args->Ts, "sequence lengths, comma-separated")->capture_default_str();
  sub->add_option("--methods", args->methods,
                  "flash,stabilized_flash,flash_sm90,stabilized_flash_sm90,cudnn,baseline")
      ->capture_default_str();
  sub->add_option("--tiles", args->tiles, "flash tiles: auto (d 64: 128x128, d 128: 128x64) or QxK")
      ->capture_default_str();
  sub->add_option("--dtype", args->dtype, "bf16 | fp16")->capture_default_str();
  sub->add_option("--tokens", args->tokens, "B*T")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--width", args->width, "H*d")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--reps", args->reps, "timed repetitions (median)")->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--warmup", args->warmup, "untimed repetitions")->capture_default_str();
  sub->add_option("--delta-T", args->delta_T, "T of the delta-mode speed table")->capture_default_str();
  sub->add_flag("!--no-memory", args->memory, "skip the memory table");
  sub->add_flag("!--no-deltas", args->deltas, "skip the delta-mode table");
  sub->add_flag("!--no-deviation", args->deviation, "skip the deviation-from-FP64 table");
  sub->callback([args, &rc] {
    try {
      rc = run_attention_bench(*args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench attention: %s\n", e.what());
      rc = 1;
    }
  });
  return sub;
}

}  // namespace st
