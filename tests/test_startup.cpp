// What a run says at start-up and while it runs (issue 22): the memory estimate against
// the bytes the model really allocates, the refusal line, the timing/ETA line and the slow
// hook's progress decisions. The refusal through the train binary is in test_trainer.cpp.
#include <gtest/gtest.h>

#include <numeric>

#include "backends/backends.h"
#include "model/gpt2.h"
#include "model_shapes.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/progress.h"

namespace st {
namespace {

// vocab_size 300, padded to 384.
GPT2Config tiny() { return test::gpt2_shape(3, 4, 64, 32, 300); }

// The estimate's model part is what GPT2 allocates, to the byte, in every precision and
// recomputation mode, sharded or not, with the kSeparate scratch.
TEST(MemoryEstimate, ModelMemoryIsWhatTheModelAllocates) {
  auto be = make_cpu_backend();
  const GPT2Config c = tiny();
  const int B = 3, T = 20;
  for (DType f : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (Recompute r : {Recompute::kNone, Recompute::kGelu, Recompute::kGeluLayernorm})
      for (int64_t shard : {int64_t(-1), int64_t(1000)}) {
        OptimShard sh;
        if (shard >= 0) sh = {64, 64 + shard};
        GPT2 m(c, *be, f, AttentionConfig{}, {}, sh);
        m.set_recompute(r);
        m.set_grad_accum_mode(GradAccumMode::kSeparate);
        m.init_weights(1);
        std::vector<int32_t> x(B * T), y(B * T);
        std::iota(x.begin(), x.end(), 0);
        std::iota(y.begin(), y.end(), 1);
        m.zero_grad();
        for (int a = 0; a < 2; ++a) {  // the second backward allocates the scratch
          m.forward(x.data(), y.data(), B, T);
          m.backward(2);
        }
        const ModelMemory e = model_memory(c, *be, f, B, T, r, true, shard);
        const std::string what = std::string(dtype_name(f)) + " " + recompute_name(r) +
                                 (shard >= 0 ? " sharded" : "");
        EXPECT_EQ(e.params, static_cast<int64_t>(m.params_flat().nbytes())) << what;
        EXPECT_EQ(e.grads, static_cast<int64_t>(m.grads_flat().nbytes())) << what;
        EXPECT_EQ(e.master + e.adam_mv, static_cast<int64_t>(m.optimizer_bytes())) << what;
        EXPECT_EQ(e.grad_scratch, e.grads) << what;
        // activation_bytes() counts the backend's tensors; the list adds the host tokens
        // and targets (2 x B x T int32).
        EXPECT_EQ(e.activations, static_cast<int64_t>(m.activation_bytes()) + 2 * B * T * 4)
            << what;
      }
}

Config run_config(int B, int T) {
  Config cfg = parse_config(
      "run: {name: t, out_dir: runs/t}\n"
      "model: {n_layer: 12, n_head: 12, n_embd: 768, max_seq_len: 1024, vocab_size: 50257}\n"
      "data: {train_path: x.bin, tokenizer: gpt2}\n"
      "train: {batch_size: " + std::to_string(B) + ", seq_len: " + std::to_string(T) +
          ", grad_accum_steps: 8, sample_tokens: 0}\n"
      "hooks: {every: 100}\n",
      "configs/big.yaml");
  return cfg;
}

GPT2Config model_of(const Config& cfg) {
  GPT2Config c;
  c.n_layer = cfg.model.n_layer, c.n_head = cfg.model.n_head, c.n_embd = cfg.model.n_embd;
  c.max_seq_len = cfg.model.max_seq_len, c.vocab_size = cfg.model.vocab_size;
  return c;
}

// GPT-2 small's items: fp32 on the CPU holds 4 + 4 + 8 bytes per parameter, the
// activations grow with B x T, and the largest transient is the hooks' FP64 gradients or
// the checkpoint write.
TEST(MemoryEstimate, Gpt2SmallItemsAndLine) {
  auto be = make_cpu_backend();
  const Config cfg = run_config(4, 64);
  const GPT2Config mc = model_of(cfg);
  const MemoryEstimate e = estimate_memory(cfg, mc, *be, -1, 2);
  const int64_t n = num_parameters(mc);
  int64_t params = 0, mv = 0;
  for (const MemoryItem& i : e.resident) {
    if (i.name == "parameters") params = i.bytes;
    if (i.name == "AdamW m and v") mv = i.bytes;
  }
  EXPECT_EQ(params, 4 * n);
  EXPECT_EQ(mv, 8 * n);
  EXPECT_EQ(e.activations, model_memory(mc, *be, DType::F32, 4, 64, Recompute::kNone, false)
                               .activations);
  ASSERT_NE(e.peak_transient(), nullptr);
  EXPECT_EQ(e.total(), e.resident_bytes() + e.peak_transient()->bytes);
  const Config big = run_config(16, 1024);
  const MemoryEstimate eb = estimate_memory(big, mc, *be, -1, 2);
  EXPECT_EQ(eb.activations, 64 * e.activations);  // every activation grows with B x T
  const std::string line = e.line();
  EXPECT_EQ(line.rfind("memory estimate: ", 0), 0u) << line;
  EXPECT_NE(line.find("activations (4 x 64)"), std::string::npos) << line;
  EXPECT_NE(line.find("largest transient"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

// The CPU attention's state kept for backward: per layer, sequence and head, FP64 O, O
// before rounding and lse, plus the baseline's T x T probabilities (19 GiB for GPT-2
// small's 16 x 1024 micro-batch, the bulk of its 21.6 GB).
TEST(MemoryEstimate, CpuAttentionStateByBackend) {
  Config cfg = run_config(16, 1024);
  const GPT2Config mc = model_of(cfg);
  const int64_t heads = 16 * 12, T = 1024, hs = 64;
  const int64_t common = 12 * heads * (2 * T * hs + T) * 8;
  EXPECT_EQ(cpu_attention_saved_bytes(cfg, mc, 16, 1024), common + 12 * heads * T * T * 8);
  cfg.attention.backend = "flash";
  EXPECT_EQ(cpu_attention_saved_bytes(cfg, mc, 16, 1024), common);
  auto be = make_cpu_backend();
  const MemoryEstimate e = estimate_memory(cfg, mc, *be, -1, 2);
  EXPECT_EQ(e.attention_saved, common);
}

TEST(MemoryEstimate, RefusalIsOneLineNamingTheConfigAndKeys) {
  auto be = make_cpu_backend();
  const Config cfg = run_config(16, 1024);
  const MemoryEstimate e = estimate_memory(cfg, model_of(cfg), *be, -1, 2);
  AvailableMemory a;
  a.bytes = e.total();  // fits exactly
  a.source = "MemAvailable";
  EXPECT_EQ(memory_refusal(e, a, cfg), "");
  a.bytes = -1;  // unknown: no refusal
  EXPECT_EQ(memory_refusal(e, a, cfg), "");
  a.bytes = e.total() - 1;
  const std::string why = memory_refusal(e, a, cfg);
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  for (const char* s : {"configs/big.yaml", "train.batch_size 16", "train.seq_len 1024",
                        "train.grad_accum_steps", "MemAvailable", "131072"})
    EXPECT_NE(why.find(s), std::string::npos) << s << " in " << why;
  const AvailableMemory here = available_memory();
  EXPECT_GT(here.bytes, 0);
  EXPECT_FALSE(here.source.empty());
}

TEST(Progress, FormatEtaAndThousands) {
  EXPECT_EQ(format_eta(45.4), "45 s");
  EXPECT_EQ(format_eta(192), "3 min 12 s");
  EXPECT_EQ(format_eta(6 * 3600 + 41 * 60 + 10), "6 h 41 min");
  EXPECT_EQ(format_eta(-1), "?");
  EXPECT_EQ(group_thousands(9997), "9,997");
  EXPECT_EQ(group_thousands(1234567), "1,234,567");
  EXPECT_EQ(group_thousands(12), "12");
}

// The timing line: the invocation's first two steps and hook steps are not measured; due
// once, after three measured steps and the minimum time.
TEST(Progress, StepTimingSkipsWarmupAndHookSteps) {
  StepTiming t(0, 10.0);
  EXPECT_FALSE(t.add(1, 100.0, false, 100));  // warm-up
  EXPECT_FALSE(t.add(2, 100.0, false, 200));  // warm-up
  EXPECT_FALSE(t.add(3, 2.0, false, 202));
  EXPECT_FALSE(t.add(4, 50.0, true, 252));  // hook step
  EXPECT_FALSE(t.add(5, 3.0, false, 255));
  EXPECT_TRUE(t.add(6, 4.0, false, 259));
  EXPECT_FALSE(t.add(7, 4.0, false, 263));  // once
  EXPECT_DOUBLE_EQ(t.per_step(), 3.0);
  EXPECT_EQ(t.from(), 3);
  EXPECT_EQ(t.to(), 6);
  EXPECT_EQ(t.steps(), 3);
  EXPECT_EQ(timing_line(t, 9994),
            "timing: 3.00 s/step over steps 3-6 (3 steps); 9,994 steps left -> ETA 8 h 19 min "
            "(excluding evaluation, checkpoints and hook steps)");
  // Fast steps: the line waits for the minimum time; a resumed run starts counting later.
  StepTiming f(100, 10.0);
  for (int s = 101; s <= 110; ++s) EXPECT_FALSE(f.add(s, 0.01, false, 0.01 * (s - 100)));
  EXPECT_TRUE(f.add(111, 0.01, false, 10.0));
  EXPECT_EQ(f.from(), 103);
  EXPECT_NE(timing_line(f, 5).find("10.0 ms/step"), std::string::npos) << timing_line(f, 5);
}

// The periodic lines' ETA: ordinary steps at their recent mean, hook steps, evaluations and
// checkpoints at their last measured cost times the number still due; the window follows a
// slowdown. Times are injected (no clock).
TEST(Progress, RecentEtaCountsEverythingAndFollowsASlowdown) {
  RecentEta e(0);
  RecentEta::Left left;
  left.steps = 100;
  EXPECT_LT(e.eta(left), 0);  // nothing measured yet
  EXPECT_EQ(format_eta(e.eta(left)), "?");
  double now = 0;
  e.step(1, now += 9, 9.0, false);  // warm-up: not measured
  e.step(2, now += 9, 9.0, false);
  EXPECT_LT(e.eta(left), 0);
  for (int s = 3; s <= 52; ++s) e.step(s, now += 1, 1.0, false);
  EXPECT_DOUBLE_EQ(e.per_step(), 1.0);
  EXPECT_DOUBLE_EQ(e.eta(left), 100.0);
  // A hook step (5 s), an evaluation (20 s) and a checkpoint (3 s) are measured once and
  // counted as often as the schedule still holds them; a hook step leaves the window alone.
  e.step(53, now += 5, 5.0, true);
  e.evaluation(20.0);
  e.checkpoint(3.0);
  EXPECT_DOUBLE_EQ(e.per_step(), 1.0);
  left.hook_steps = 10;
  left.evals = 4;
  left.checkpoints = 2;
  EXPECT_DOUBLE_EQ(e.eta(left), 90 * 1.0 + 10 * 5.0 + 4 * 20.0 + 2 * 3.0);
  // The machine gets busier: 50 steps of 3 s, well over a minute, push the 1 s steps out of
  // the window, so the ETA triples instead of creeping up as a whole-run mean would.
  for (int s = 54; s <= 103; ++s) e.step(s, now += 3, 3.0, false);
  EXPECT_EQ(e.window_steps(), RecentEta::kWindowSteps);
  EXPECT_DOUBLE_EQ(e.per_step(), 3.0);
  EXPECT_DOUBLE_EQ(e.eta(left), 90 * 3.0 + 10 * 5.0 + 4 * 20.0 + 2 * 3.0);
  // Fast steps: the window keeps every step of the last minute (more than 50) ...
  RecentEta f(100);
  now = 0;
  for (int s = 101; s <= 400; ++s) f.step(s, now += 0.1, 0.1, false);
  EXPECT_EQ(f.window_steps(), 298);  // steps 103-400: 29.8 s, all within the minute
  // ... and a slow segment inside it raises the ETA above the fast steps' alone.
  RecentEta::Left l10;
  l10.steps = 10;
  const double before = f.eta(l10);
  for (int s = 401; s <= 410; ++s) f.step(s, now += 2.0, 2.0, false);
  EXPECT_GT(f.eta(l10), before);
  EXPECT_NEAR(f.per_step(), (298 * 0.1 + 10 * 2.0) / 308, 1e-12);
}

TEST(Progress, SlowHookLinesAtMostEveryFiveSeconds) {
  SlowProgress p;
  EXPECT_FALSE(p.due(0.5));
  EXPECT_FALSE(p.due(4.9));
  EXPECT_TRUE(p.due(5.1));
  EXPECT_FALSE(p.due(9.0));
  EXPECT_TRUE(p.due(10.2));
  EXPECT_FALSE(p.due(15.1));
  EXPECT_TRUE(p.due(15.3));
}

}  // namespace
}  // namespace st
