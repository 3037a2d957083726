// The whole GPT-2 on the GPU (label gpu; every test FAILS, never skips, without a GPU):
//  - parity with the CPU backend: forward loss, every gradient tensor, and 10 AdamW steps
//    (losses and weights), in FP32 and BF16, baseline attention and per-layer overrides;
//  - run-to-run determinism (identical losses and weight bits), activation recomputation
//    (same bits, less memory) and forward_backward (the bits of forward + backward) on the
//    GPU;
//  - the trainer on the GPU: two runs identical, 10 steps + resume + 10 steps equal to 20
//    straight (losses, weights hash, metrics), hooks and the text sample working (baseline,
//    a flash layer, a cudnn layer);
//  - cuDNN's fused attention (attention.backend cudnn) training 20 steps within the BF16
//    band of the baseline, on a repeated batch whose loss falls (checked on the CPU by
//    GpuModelSetup.*, label cpu).
//
// Tolerances. The GPU rounds at the CPU backend's points (every stored result, RNE); what
// differs is the order of the FP32 sums inside GEMMs and reductions. FP32 mode: those
// orders change results by a few FP32 ulps per op, so the norm-wise relative difference of
// the loss, gradients and weights stays below 1e-4 (bound asserted). BF16 mode: a different
// FP32 sum flips a BF16 rounding now and then (one BF16 ulp, 2^-8 relative), and flips
// propagate; no fixed bound is honest, so the GPU-vs-CPU difference is judged against what
// BF16 itself does to the same model: it must stay below twice the CPU's own BF16-vs-FP32
// difference. (Review: "below half" does not hold. The flips cascade through the BF16
// rounding points, so two BF16 runs that differ only in FP32 summation order drift apart
// almost as far as BF16 drifts from FP32 (two independent BF16 errors: up to sqrt(2) times
// it), and the attention's k bias has a gradient that is 0 in exact arithmetic, pure
// rounding noise that AdamW normalises into full-size updates. A CPU emulation (every GEMM
// summed in another FP32 order, attention MACs in FP64; this model, these seeds) gave, as
// fractions of the bar: step-0 gradients up to 0.50 / 0.43 / 0.67 (variants 0 / 1 / 2),
// 10-step losses 0.60 / 0.59 / 1.05, weights 0.74 / 0.79 / 0.77, and loss0 8e-7 / 1.7e-6 /
// 2.6e-6 against a bar of 1.5e-6 / 1.1e-6 / 2.1e-6.) A wrong attention, transposed GEMM or
// missed mask moves the step-0 gradients by O(1), far beyond twice the BF16 bar (<= 1e-2).
// Every figure is printed on a "parity model ..." line (tools/gpu_check.sh collects them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/rng.h"
#include "gpu_test_util.h"
#include "model/gpt2.h"
#include "model_shapes.h"
#include "test_util.h"
#include "train/config.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace st {
namespace {

// L = 2, NH = 2, C = 128: head size 64, which every GPU attention backend supports.
GPT2Config small_cfg() { return st::test::gpt2_shape(2, 2, 128, 64, 200); }

constexpr int kB = 4, kT = 64;

void batch(std::vector<int32_t>& tok, std::vector<int32_t>& tgt, int V, uint64_t seed) {
  Rng r(seed);
  tok.resize(kB * kT);
  tgt.resize(kB * kT);
  for (int i = 0; i < kB * kT; ++i) {
    tok[i] = static_cast<int32_t>(r.below(V));
    tgt[i] = static_cast<int32_t>(r.below(V));
  }
}

std::vector<double> to_doubles(Backend& be, const Tensor& t) {
  Tensor h = Tensor::empty({t.numel()}, DType::F64);
  be.copy(h, t);
  const double* p = h.data<double>();
  return std::vector<double>(p, p + t.numel());
}

// What one model run produced.
struct Trace {
  std::vector<float> losses;                // per step
  std::vector<std::vector<double>> grads0;  // every gradient tensor after step 0's backward
  std::vector<float> weights;               // master weights after the last step
  size_t activation_bytes = 0;
  std::vector<std::string> attention_names;
};

// kFresh: a new batch of uniform tokens and independent uniform targets every step (nothing
// to learn: the loss stays near ln V). kRepeated: step 0's batch at every step, which the
// model can fit, so its loss falls (GpuModelSetup checks that on the CPU).
enum class Data { kFresh, kRepeated };

// kForwardBackward: GPT2::forward_backward (the training step's one classifier pass)
// instead of forward() then backward().
enum class Pass { kSeparate, kForwardBackward };

Trace run_model(Backend& be, DType prec, const std::vector<AttentionConfig>& attn, int steps,
                Recompute rc = Recompute::kNone, Data data = Data::kFresh,
                Pass pass = Pass::kSeparate) {
  const GPT2Config cfg = small_cfg();
  GPT2 m(cfg, be, prec, attn);
  m.set_recompute(rc);
  m.init_weights(2024);
  OptimConfig opt;
  opt.weight_decay = 0.1f;
  Trace tr;
  std::vector<int32_t> tok, tgt;
  for (int s = 0; s < steps; ++s) {
    batch(tok, tgt, cfg.vocab_size, data == Data::kFresh ? 500 + s : 500);
    m.zero_grad();
    if (pass == Pass::kForwardBackward) {
      tr.losses.push_back(m.forward_backward(tok.data(), tgt.data(), kB, kT));
    } else {
      tr.losses.push_back(m.forward(tok.data(), tgt.data(), kB, kT));
      m.backward();
    }
    if (s == 0)
      for (int id = 0; id < kNumParams; ++id) tr.grads0.push_back(to_doubles(be, m.grad(id)));
    m.step(1e-3f, opt);
  }
  tr.weights = m.master_fp32();
  tr.activation_bytes = m.activation_bytes();
  for (int l = 0; l < cfg.n_layer; ++l) tr.attention_names.push_back(m.attention(l).name());
  return tr;
}

double normwise(const std::vector<double>& a, const std::vector<double>& ref) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - ref[i]) * (a[i] - ref[i]);
    r += ref[i] * ref[i];
  }
  return r > 0 ? std::sqrt(d / r) : std::sqrt(d);
}
std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<AttentionConfig> layers(AttentionKind l0, AttentionKind l1) {
  AttentionConfig a, b;
  a.kind = l0;
  b.kind = l1;
  return {a, b};
}

// Differences of run x against run ref: loss (step 0), every gradient tensor, the losses
// of all steps and the final weights.
struct Diff {
  double loss0 = 0, loss_curve = 0, weights = 0;
  std::vector<double> grads;
};
Diff diff(const Trace& x, const Trace& ref) {
  Diff d;
  d.loss0 = std::fabs(x.losses[0] - ref.losses[0]) / std::fabs(ref.losses[0]);
  d.loss_curve = normwise(widen(x.losses), widen(ref.losses));
  d.weights = normwise(widen(x.weights), widen(ref.weights));
  for (size_t i = 0; i < ref.grads0.size(); ++i) d.grads.push_back(normwise(x.grads0[i], ref.grads0[i]));
  return d;
}

void print(const char* label, const Diff& d) {
  std::printf("parity model %s: loss0 rel %.3e, 10-step losses %.3e, weights %.3e; grads:",
              label, d.loss0, d.loss_curve, d.weights);
  for (size_t i = 0; i < d.grads.size(); ++i) std::printf(" %s %.2e", param_name(static_cast<int>(i)), d.grads[i]);
  std::printf("\n");
}

constexpr int kSteps = 10;

TEST(GpuModel, Fp32MatchesTheCpuBackend) {
  require_gpu();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const auto attn = layers(AttentionKind::Baseline, AttentionKind::Baseline);
  const Trace c = run_model(*cpu, DType::F32, attn, kSteps);
  const Trace g = run_model(*gpu, DType::F32, attn, kSteps);
  const Diff d = diff(g, c);
  print("fp32 gpu vs cpu", d);
  EXPECT_LT(d.loss0, 1e-5);
  EXPECT_LT(d.loss_curve, 1e-4);
  EXPECT_LT(d.weights, 1e-4);
  for (size_t i = 0; i < d.grads.size(); ++i)
    EXPECT_LT(d.grads[i], 1e-4) << param_name(static_cast<int>(i));
  EXPECT_LT(g.losses.back(), g.losses.front() + 0.5) << "training diverged on the GPU";
}

class GpuModelBf16 : public ::testing::TestWithParam<int> {};

// Param 0: baseline in both layers; 1: baseline, then flash; 2: stabilized flash, baseline.
TEST_P(GpuModelBf16, MatchesTheCpuBackendWithinBf16Noise) {
  require_gpu();
  const AttentionKind kinds[3][2] = {{AttentionKind::Baseline, AttentionKind::Baseline},
                                     {AttentionKind::Baseline, AttentionKind::Flash},
                                     {AttentionKind::StabilizedFlash, AttentionKind::Baseline}};
  const auto attn = layers(kinds[GetParam()][0], kinds[GetParam()][1]);
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const Trace c32 = run_model(*cpu, DType::F32, attn, kSteps);
  const Trace c16 = run_model(*cpu, DType::BF16, attn, kSteps);
  const Trace g16 = run_model(*gpu, DType::BF16, attn, kSteps);
  // Per-layer backends dispatch on the GPU exactly as on the CPU.
  EXPECT_EQ(g16.attention_names, c16.attention_names);
  for (int l = 0; l < 2; ++l) EXPECT_EQ(g16.attention_names[l], attention_kind_name(kinds[GetParam()][l]));
  const Diff noise = diff(c16, c32), d = diff(g16, c16);
  const std::string label = std::string("bf16 ") + g16.attention_names[0] + "+" + g16.attention_names[1];
  print((label + " cpu bf16 vs cpu fp32 (the bar)").c_str(), noise);
  print((label + " gpu bf16 vs cpu bf16").c_str(), d);
  // Twice the bar (review: half the bar fails on a correct GPU, see the header); loss0's
  // bar is ~1e-6 (tens of FP32 ulps: at initialisation the loss is ~ln V whatever the
  // rounding), hence its absolute slack.
  EXPECT_LT(d.loss0, 2 * noise.loss0 + 2e-6);
  EXPECT_LT(d.loss_curve, 2 * noise.loss_curve);
  EXPECT_LT(d.weights, 2 * noise.weights);
  for (size_t i = 0; i < d.grads.size(); ++i) {
    if (noise.grads[i] == 0) continue;  // e.g. padded rows only: nothing to compare against
    EXPECT_LT(d.grads[i], 2 * noise.grads[i]) << param_name(static_cast<int>(i));
  }
}
INSTANTIATE_TEST_SUITE_P(Layers, GpuModelBf16, ::testing::Values(0, 1, 2));

// The 20-step setup of CudnnTrainsLikeBaselineWithinTheBf16Band: one batch repeated, so
// that training has something to fit. Fresh random tokens with independent random targets
// (the other tests' data) leave nothing to learn: on the H200 (f8b7fb4) the loss went
// 5.32819 -> 5.32878 with baseline attention and 5.32821 -> 5.32860 with cudnn, so "the loss
// falls" was false for the setup itself. With the repeated batch the CPU's loss falls
// 5.328 -> 1.963 (FP32) and 5.328 -> 1.964 (BF16) in 20 steps; every backend must show a
// fall of kMinFall, under a third of that.
constexpr int kLong = 20;
constexpr double kMinFall = 1.0;

void print_losses(const char* label, const Trace& t) {
  std::printf("parity model %s losses:", label);
  for (float l : t.losses) std::printf(" %.5f", l);
  std::printf("\n");
}

// The premise, on the CPU (label cpu: no GPU needed): the repeated batch's loss falls by
// more than kMinFall in 20 steps, in FP32 and in BF16.
TEST(GpuModelSetup, RepeatedBatchLossFallsOnTheCpu) {
  const auto base = layers(AttentionKind::Baseline, AttentionKind::Baseline);
  auto cpu = make_cpu_backend();
  for (DType prec : {DType::F32, DType::BF16}) {
    const Trace t = run_model(*cpu, prec, base, kLong, Recompute::kNone, Data::kRepeated);
    print_losses((std::string("cpu ") + dtype_name(prec) + " repeated batch").c_str(), t);
    ASSERT_EQ(t.losses.size(), static_cast<size_t>(kLong));
    EXPECT_LT(t.losses.back(), t.losses.front() - kMinFall) << dtype_name(prec);
  }
}

// attention.backend cudnn (issue 25): the whole model, 20 BF16 steps with cuDNN's fused
// attention in both layers, follows the same model with baseline attention on the GPU within
// the BF16 band the other backends are held to above: the loss curve, final weights and
// step-0 gradients differ from the baseline run by less than twice what BF16 itself does to
// this model (the CPU's BF16-vs-FP32 difference, baseline attention, 20 steps, the same
// repeated batch). Our flash is measured the same way beside it, for comparison. Each of
// the three GPU runs must train: its loss falls by more than kMinFall.
TEST(GpuModel, CudnnTrainsLikeBaselineWithinTheBf16Band) {
  require_gpu();
  const auto base = layers(AttentionKind::Baseline, AttentionKind::Baseline);
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const auto run = [&](Backend& be, DType prec, const std::vector<AttentionConfig>& attn) {
    return run_model(be, prec, attn, kLong, Recompute::kNone, Data::kRepeated);
  };
  const Trace c32 = run(*cpu, DType::F32, base);
  const Trace c16 = run(*cpu, DType::BF16, base);
  const Trace gb = run(*gpu, DType::BF16, base);
  const Trace gc = run(*gpu, DType::BF16, layers(AttentionKind::Cudnn, AttentionKind::Cudnn));
  const Trace gf = run(*gpu, DType::BF16, layers(AttentionKind::Flash, AttentionKind::Flash));
  EXPECT_EQ(gc.attention_names, (std::vector<std::string>{"cudnn", "cudnn"}));
  const Diff bar = diff(c16, c32), dc = diff(gc, gb), df = diff(gf, gb);
  print("bf16 20 steps cpu bf16 vs cpu fp32 (the bar)", bar);
  print("bf16 20 steps gpu cudnn vs gpu baseline", dc);
  print("bf16 20 steps gpu flash vs gpu baseline", df);
  print_losses("cudnn", gc);
  print_losses("baseline", gb);
  print_losses("flash", gf);
  EXPECT_LT(dc.loss0, 2 * bar.loss0 + 2e-6);
  EXPECT_LT(dc.loss_curve, 2 * bar.loss_curve);
  EXPECT_LT(dc.weights, 2 * bar.weights);
  for (size_t i = 0; i < dc.grads.size(); ++i) {
    if (bar.grads[i] == 0) continue;
    EXPECT_LT(dc.grads[i], 2 * bar.grads[i]) << param_name(static_cast<int>(i));
  }
  for (const auto& [name, t] : {std::pair<const char*, const Trace*>{"baseline", &gb},
                                {"cudnn", &gc}, {"flash", &gf}}) {
    ASSERT_EQ(t->losses.size(), static_cast<size_t>(kLong)) << name;
    EXPECT_LT(t->losses.back(), t->losses.front() - kMinFall) << "the loss did not fall with " << name;
  }
}

TEST(GpuModel, RunsAreBitIdenticalAndRecomputationKeepsTheBits) {
  require_gpu();
  for (DType prec : {DType::BF16, DType::F32}) {
    for (int variant = 0; variant < 2; ++variant) {
      if (variant == 1 && prec == DType::F32) continue;  // the flash kernels are bf16/fp16
      const auto attn = variant == 0 ? layers(AttentionKind::Baseline, AttentionKind::Baseline)
                                     : layers(AttentionKind::Flash, AttentionKind::StabilizedFlash);
      auto be = make_cuda_backend(0);
      const Trace a = run_model(*be, prec, attn, kSteps);
      const Trace b = run_model(*be, prec, attn, kSteps);
      const Trace r = run_model(*be, prec, attn, kSteps, Recompute::kGeluLayernorm);
      const Trace fb = run_model(*be, prec, attn, kSteps, Recompute::kNone, Data::kFresh,
                                 Pass::kForwardBackward);
      const std::string what = std::string(dtype_name(prec)) + " " + a.attention_names[0] + "+" +
                               a.attention_names[1];
      ASSERT_EQ(a.losses.size(), static_cast<size_t>(kSteps));
      EXPECT_EQ(0, std::memcmp(a.losses.data(), b.losses.data(), kSteps * sizeof(float))) << what;
      EXPECT_EQ(0, std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * 4)) << what;
      EXPECT_EQ(a.grads0, b.grads0) << what;
      EXPECT_EQ(0, std::memcmp(a.losses.data(), r.losses.data(), kSteps * sizeof(float)))
          << what << " with recomputation";
      EXPECT_EQ(0, std::memcmp(a.weights.data(), r.weights.data(), a.weights.size() * 4))
          << what << " with recomputation";
      EXPECT_LT(r.activation_bytes, a.activation_bytes);
      EXPECT_EQ(0, std::memcmp(a.losses.data(), fb.losses.data(), kSteps * sizeof(float)))
          << what << " with forward_backward";
      EXPECT_EQ(a.grads0, fb.grads0) << what << " with forward_backward";
      EXPECT_EQ(0, std::memcmp(a.weights.data(), fb.weights.data(), a.weights.size() * 4))
          << what << " with forward_backward";
      std::printf("determinism %s: 2 runs x %d steps bit-identical; recompute gelu_layernorm "
                  "identical, activations %zu -> %zu bytes; forward_backward identical\n",
                  what.c_str(), kSteps, a.activation_bytes, r.activation_bytes);
    }
  }
}

// ---------------------------------------------------------------- the trainer

const fs::path& tmp_root() {
  static const fs::path p = st::test::make_scratch_dir("st_gpu_model_test_");
  return p;
}

Config trainer_config(const std::string& name, const std::string& extra_attention = "") {
  std::ostringstream y;
  y << "run: {name: t, out_dir: '" << (tmp_root() / name).string() << "', seed: 7}\n"
    << "model: {n_layer: 2, n_head: 2, n_embd: 128, max_seq_len: 32, vocab_size: 256}\n"
    << "data: {train_path: '" << st::test::pseudo_text_file(tmp_root() / "text.txt")
    << "', tokenizer: byte, val_fraction: 0.1}\n"
    << "train: {max_steps: 20, batch_size: 4, seq_len: 32, grad_accum_steps: 2, lr: 3.0e-3,"
    << " min_lr: 3.0e-4, warmup_steps: 3, ckpt_every: 5, keep_checkpoints: 0, eval_every: 10,"
    << " eval_batches: 2, log_every: 5, sample_tokens: 16, recompute: gelu}\n"
    << "precision: {compute: bf16}\n"
    << "attention: {backend: baseline" << extra_attention << "}\n"
    << "hooks: {every: 5, drift_rows: 1}\n"
    << "device: cuda\n";
  return parse_config(y.str(), name + ".yaml");
}

TrainOptions quiet() {
  TrainOptions o;
  o.console = false;
  return o;
}

size_t data_rows(const fs::path& csv) {
  std::ifstream f(csv);
  size_t n = 0;
  for (std::string l; std::getline(f, l);) n += !l.empty();
  return n > 0 ? n - 1 : 0;  // minus the header
}

class GpuTrainer : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuTrainer, TwoRunsIdenticalResumeBitExactHooksWork) {
  require_gpu();
  const std::string variant = GetParam();
  const std::string extra = variant == std::string("baseline")   ? ""
                            : variant == std::string("cudnn_layer1") ? ", layer_backends: '1:cudnn'"
                                                                     : ", layer_backends: '1:flash'";
  const TrainResult a = run_training(trainer_config("a_" + variant, extra), quiet());
  const TrainResult b = run_training(trainer_config("b_" + variant, extra), quiet());
  ASSERT_EQ(a.losses.size(), 20u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.weights_sha256, b.weights_sha256);
  EXPECT_LT(a.losses.back(), a.losses.front()) << "the loss did not fall on the GPU";
  EXPECT_FALSE(a.sample.empty()) << "no text sample";

  TrainOptions first = quiet();
  first.stop_after = 10;
  const TrainResult c1 = run_training(trainer_config("c_" + variant, extra), first);
  TrainOptions again = quiet();
  again.resume = true;
  const TrainResult c2 = run_training(trainer_config("c_" + variant, extra), again);
  EXPECT_EQ(c1.last_step, 10);
  EXPECT_EQ(c2.first_step, 10);
  std::vector<float> joined = c1.losses;
  joined.insert(joined.end(), c2.losses.begin(), c2.losses.end());
  EXPECT_EQ(joined, a.losses) << "10 + resume + 10 differs from 20 straight on the GPU";
  EXPECT_EQ(c2.weights_sha256, a.weights_sha256);
  EXPECT_EQ(c2.val_loss, a.val_loss);
  std::printf("trainer gpu %s: 2 runs identical, resume bit-exact; loss %.4f -> %.4f, %.0f "
              "tokens/s\n", variant.c_str(), a.losses.front(), a.losses.back(), a.tokens_per_s);

  // The hooks ran on the GPU run: steps 0, 5, 10, 15, 20 (and checkpoints) in every file.
  const fs::path dir = tmp_root() / ("a_" + variant);
  for (const char* f : {"spectral.csv", "grad_norms.csv", "attn_stats.csv", "delta_drift.csv"}) {
    EXPECT_GT(data_rows(dir / f), 0u) << f << " has no rows";
  }
  // attn_stats: one row per (step, layer, head, stat) for both layers: the GPU attention
  // backends report statistics.
  std::ifstream st(dir / "attn_stats.csv");
  int layer1 = 0;
  for (std::string l; std::getline(st, l);) {
    const size_t c1 = l.find(','), c2 = l.find(',', c1 + 1);
    layer1 += c1 != std::string::npos && l.substr(c1 + 1, c2 - c1 - 1) == "1";
  }
  EXPECT_GT(layer1, 0) << "no attention statistics from layer 1";
}
INSTANTIATE_TEST_SUITE_P(Attention, GpuTrainer,
                         ::testing::Values("baseline", "flash_layer1", "cudnn_layer1"));

}  // namespace
}  // namespace st
