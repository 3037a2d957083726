// bench train: training throughput of a GPT-2 (124M by default) on one device.
//   bench train [--device auto|cpu|cuda] [--B 0] [--T 1024] [--steps 10] [--attention baseline]
//               [--cuda-kernel mma_sync|sm90]
//               [--precision bf16] [--recompute none] [--peak-tflops 0] [--layers 12 ...]
// Prints tokens/s, ms/step and MFU (llm.c's convention: FLOPs per token = 6 N + 6 L C T with
// N every parameter, padded vocabulary included; peak 989 TFLOP/s dense BF16 for H100 and
// H200), the comparison figures (llm.c's 468K tokens/s per H100 with cuDNN flash attention,
// the MFU target) and the ratios, the peak device memory, and a per-kernel-family
// breakdown measured in a separate pass that synchronizes after every call (so its total
// exceeds the free-running step time; read it as shares).
// --B 0 picks the largest micro-batch that fits on a GPU: 64, 48, 32, 24, 16, 12, 8, 6, 4, 2,
// 1 are tried in turn, each on a fresh backend (the arena returns memory only when it goes),
// and the first whose warm-up step runs without running out of device memory is measured
// (on the CPU, --B 0 means B = 4).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/rng.h"
#include "core/timing_backend.h"
#include "model/gpt2.h"

namespace st {
namespace {

struct TrainBenchArgs {
  std::string device = "auto";
  int B = 0, T = 1024, steps = 10, warmup = 2, breakdown_steps = 3;
  std::string attention = "baseline", precision = "bf16", recompute = "none";
  std::string cuda_kernel = "mma_sync";  // attention.cuda_kernel (flash kinds)
  double peak_tflops = 0;
  GPT2Config cfg;  // 124M by default
};

bool out_of_memory(const std::exception& e) {
  const std::string m = e.what();
  return m.find("out of device memory") != std::string::npos ||
         m.find("out of memory") != std::string::npos;
}

// The model, its backend and one reusable batch of random tokens.
struct Setup {
  std::unique_ptr<Backend> be;
  std::unique_ptr<TimingBackend> timing;
  std::unique_ptr<GPT2> model;
  std::vector<int32_t> tok, tgt;
  int B = 0, T = 0;

  Setup(const TrainBenchArgs& a, int B_, bool timed) : B(B_), T(a.T) {
    be = make_backend(a.device);
    Backend* use = be.get();
    if (timed) {
      timing = std::make_unique<TimingBackend>(*be);
      use = timing.get();
    }
    AttentionConfig ac;
    ac.kind = parse_attention_kind(a.attention);
    ac.cuda_kernel = parse_flash_kernel(a.cuda_kernel);
    if (ac.cuda_kernel == FlashKernel::Sm90) ac.block_q = ac.block_k = 128;  // its tiles
    model = std::make_unique<GPT2>(a.cfg, *use, parse_dtype(a.precision), ac);
    model->set_recompute(parse_recompute(a.recompute));
    model->init_weights(1337);
    Rng rng(42);
    tok.resize(static_cast<size_t>(B) * T);
    tgt.resize(tok.size());
    for (size_t i = 0; i < tok.size(); ++i) {
      tok[i] = static_cast<int32_t>(rng.below(a.cfg.vocab_size));
      tgt[i] = static_cast<int32_t>(rng.below(a.cfg.vocab_size));
    }
  }
  // One optimizer step; returns its wall time (the loss read back synchronizes, as in
  // training; the step is synchronized at its end).
  double step(float* loss = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    model->zero_grad();
    const float l = model->forward_backward(tok.data(), tgt.data(), B, T);
    OptimConfig opt;
    opt.weight_decay = 0.1f;
    model->step(3e-4f, opt);
    be->synchronize();
    if (loss) *loss = l;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

double auto_peak_tflops(const std::string& device_name) {
  // Dense BF16 tensor-core peaks: H100 SXM and H200 989 TFLOP/s (the convention),
  // H100 PCIe 756, H100 NVL 835. Other devices: --peak-tflops.
  auto has = [&](const char* s) { return device_name.find(s) != std::string::npos; };
  if (has("H100") && has("PCIe")) return 756.0;
  if (has("H100") && has("NVL")) return 835.0;
  if (has("H100") || has("H200")) return 989.0;
  return 0.0;
}

int run_train_bench(const TrainBenchArgs& a) {
  a.cfg.validate();
  ST_CHECK(a.T > 0 && a.T <= a.cfg.max_seq_len, "bench train: --T ", a.T,
           " must be in [1, max_seq_len = ", a.cfg.max_seq_len, "]");
  std::vector<int> candidates;
  if (a.B > 0) {
    candidates = {a.B};
  } else if (a.device == "cpu" || (a.device == "auto" && !cuda_available())) {
    candidates = {4};  // host memory does not run out first: the CPU default
  } else {
    candidates = {64, 48, 32, 24, 16, 12, 8, 6, 4, 2, 1};
  }
  std::unique_ptr<Setup> s;
  for (int B : candidates) {
    try {
      auto trial = std::make_unique<Setup>(a, B, false);
      trial->step();  // warm-up: allocates everything once
      s = std::move(trial);
      std::printf("micro-batch B=%d: fits\n", B);
      break;
    } catch (const std::exception& e) {
      if (!out_of_memory(e) || a.B > 0) throw;
      std::printf("micro-batch B=%d: out of device memory\n", B);
    }
  }
  ST_CHECK(s, "bench train: not even B=1 fits on this device");
  const std::string dev = s->be->name();
  const int B = s->B, T = a.T;
  for (int i = 1; i < a.warmup; ++i) s->step();
  s->be->reset_peak_memory();
  std::vector<double> times;
  float first_loss = 0, last_loss = 0;
  for (int i = 0; i < a.steps; ++i) {
    float loss = 0;
    times.push_back(s->step(&loss));
    if (i == 0) first_loss = loss;
    last_loss = loss;
  }
  const MemoryStats mem = s->be->memory();
  const size_t act_bytes = s->model->activation_bytes();
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[sorted.size() / 2];
  const double tokens = static_cast<double>(B) * T;
  const double tok_s = tokens / med;
  const double N = static_cast<double>(num_parameters(a.cfg));
  const double L = a.cfg.n_layer, C = a.cfg.n_embd;
  const double flops_per_token = 6.0 * N + 6.0 * L * C * T;
  const double peak = a.peak_tflops > 0 ? a.peak_tflops : auto_peak_tflops(dev);
  const double tflops = tok_s * flops_per_token / 1e12;
  s.reset();  // frees the device before the breakdown pass

  std::printf("device: %s\n", dev.c_str());
  std::printf("GPT-2 L=%d H=%d C=%d V=%d (%.2fM parameters incl. padded vocabulary), B=%d T=%d, "
              "%s, attention %s, recompute %s; %d timed steps after %d warm-up, median\n",
              a.cfg.n_layer, a.cfg.n_head, a.cfg.n_embd, a.cfg.vocab_size, N / 1e6, B, T,
              a.precision.c_str(), a.attention.c_str(), a.recompute.c_str(), a.steps, a.warmup);
  std::printf("FLOPs per token 6N + 6LCT = %.4g; loss %.4f -> %.4f over the timed steps (one "
              "repeated batch)\n\n", flops_per_token, first_loss, last_loss);
  std::printf("| metric | measured | comparison | ratio |\n|---|---|---|---|\n");
  std::printf("| ms/step (median; min %.1f, max %.1f) | %.1f | | |\n", sorted.front() * 1e3,
              sorted.back() * 1e3, med * 1e3);
  const bool gpu = dev.rfind("cuda", 0) == 0;
  if (gpu) {
    std::printf("| tokens/s | %.0f | 468000 (llm.c per H100, cuDNN flash) | %.3f |\n", tok_s,
                tok_s / 468000.0);
  } else {
    std::printf("| tokens/s | %.0f | (no comparison figure for %s) | |\n", tok_s, dev.c_str());
  }
  std::printf("| achieved TFLOP/s (6N + 6LCT) | %.4g | | |\n", tflops);
  if (peak > 0) {
    const double mfu = tflops / peak;
    std::printf("| MFU (peak %.0f TFLOP/s) | %.1f%% | 30%% (issue 8 target, baseline attention) | "
                "%.2f |\n", peak, 100 * mfu, mfu / 0.30);
    std::printf("| MFU vs llm.c (38%%, cuDNN flash) | %.1f%% | 38%% | %.2f |\n", 100 * mfu,
                mfu / 0.38);
  } else {
    std::printf("| MFU | unknown peak for %s: pass --peak-tflops | | |\n", dev.c_str());
  }
  if (gpu) {
    std::printf("| peak device memory (GiB) | %.2f | | |\n", mem.peak / 1073741824.0);
    std::printf("| reserved device memory (GiB) | %.2f | | |\n", mem.reserved / 1073741824.0);
  }
  std::printf("| activations + backward scratch (GiB) | %.2f | | |\n", act_bytes / 1073741824.0);

  if (a.breakdown_steps > 0) {
    Setup tsetup(a, B, true);
    tsetup.step();
    tsetup.timing->reset();
    double total = 0;
    for (int i = 0; i < a.breakdown_steps; ++i) total += tsetup.step();
    std::printf("\nper kernel family (separate pass, synchronized after every call; %d steps, "
                "%.1f ms/step in that pass):\n\n| family | ms/step | share | calls/step |\n"
                "|---|---|---|---|\n", a.breakdown_steps, 1e3 * total / a.breakdown_steps);
    double sum = 0;
    for (const auto& [name, e] : tsetup.timing->totals()) sum += e.seconds;
    std::vector<std::pair<std::string, TimingBackend::Entry>> rows(
        tsetup.timing->totals().begin(), tsetup.timing->totals().end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& x, const auto& y) { return x.second.seconds > y.second.seconds; });
    for (const auto& [name, e] : rows)
      std::printf("| %s | %.2f | %.1f%% | %ld |\n", name.c_str(), 1e3 * e.seconds / a.breakdown_steps,
                  100 * e.seconds / std::max(sum, 1e-30), e.calls / a.breakdown_steps);
  }
  return 0;
}

}  // namespace

CLI::App* add_train_bench(CLI::App& app, int& rc) {
  auto args = std::make_shared<TrainBenchArgs>();
  auto* sub = app.add_subcommand(
      "train", "training tokens/s, MFU, memory and per-kernel-family time of GPT-2 (124M default)");
  sub->add_option("--device", args->device, "auto | cpu | cuda")->capture_default_str();
  sub->add_option("--B", args->B, "micro-batch; 0: the largest that fits on a GPU (64 down), 4 on the CPU")
      ->capture_default_str();
  sub->add_option("--T", args->T, "sequence length")->capture_default_str();
  sub->add_option("--steps", args->steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--warmup", args->warmup, "warm-up steps (>= 1)")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--breakdown-steps", args->breakdown_steps, "steps of the timed-per-call pass; 0: none")
      ->capture_default_str();
  sub->add_option("--attention", args->attention, "baseline | flash | stabilized_flash | cudnn")->capture_default_str();
  sub->add_option("--cuda-kernel", args->cuda_kernel,
                  "flash kernels: mma_sync | sm90 (Hopper; tiles 128x128)")
      ->capture_default_str();
  sub->add_option("--precision", args->precision, "fp32 | bf16 | fp16")->capture_default_str();
  sub->add_option("--recompute", args->recompute, "none | gelu | gelu_layernorm")->capture_default_str();
  sub->add_option("--peak-tflops", args->peak_tflops, "peak for MFU; 0: 989 on H100/H200")
      ->capture_default_str();
  sub->add_option("--layers", args->cfg.n_layer, "n_layer")->capture_default_str();
  sub->add_option("--heads", args->cfg.n_head, "n_head")->capture_default_str();
  sub->add_option("--embd", args->cfg.n_embd, "n_embd")->capture_default_str();
  sub->add_option("--vocab", args->cfg.vocab_size, "vocab_size")->capture_default_str();
  sub->add_option("--max-seq-len", args->cfg.max_seq_len, "max_seq_len")->capture_default_str();
  sub->callback([args, &rc] {
    try {
      rc = run_train_bench(*args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench train: %s\n", e.what());
      rc = 1;
    }
  });
  return sub;
}

}  // namespace st
