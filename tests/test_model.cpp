// Model-level behaviour: gradient accumulation, bit-for-bit determinism, FP16 dynamic loss
// scaling, the learning-rate schedule, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backends/backends.h"
#include "core/backend.h"
#include "model/gpt2.h"
#include "model_shapes.h"
#include "optim/schedule.h"

using namespace st;

namespace {

GPT2Config tiny() { return test::gpt2_shape(2, 3, 24, 16, 61); }

void batch(std::vector<int32_t>& tok, std::vector<int32_t>& tgt, int n, int V, uint64_t seed) {
  Rng r(seed);
  tok.resize(n);
  tgt.resize(n);
  for (int i = 0; i < n; ++i) {
    tok[i] = static_cast<int32_t>(r.below(V));
    tgt[i] = static_cast<int32_t>(r.below(V));
  }
}

std::vector<double> flat_grads(GPT2& m) {
  std::vector<double> out;
  for (int id = 0; id < kNumParams; ++id) {
    Tensor g = m.grad(id);
    for (int64_t i = 0; i < g.numel(); ++i)
      out.push_back(g.dtype() == DType::F64 ? g.data<double>()[i] : g.data<float>()[i]);
  }
  return out;
}

}  // namespace

TEST(Model, GradAccumulationEqualsFullBatch) {
  auto be = make_cpu_backend();
  const GPT2Config cfg = tiny();
  const int B = 4, T = 9;
  std::vector<int32_t> tok, tgt;
  batch(tok, tgt, B * T, cfg.vocab_size, 5);

  GPT2 full(cfg, *be, DType::F64);
  full.init_weights(11);
  full.zero_grad();
  full.forward(tok.data(), tgt.data(), B, T);
  full.backward(1);

  GPT2 acc(cfg, *be, DType::F64);
  acc.init_weights(11);
  acc.zero_grad();
  for (int half = 0; half < 2; ++half) {
    acc.forward(tok.data() + half * (B / 2) * T, tgt.data() + half * (B / 2) * T, B / 2, T);
    acc.backward(2);
  }
  const auto a = flat_grads(full), b = flat_grads(acc);
  ASSERT_EQ(a.size(), b.size());
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_err = std::max(max_err, std::fabs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::fabs(a[i]));
  }
  EXPECT_GT(max_ref, 1e-3);
  EXPECT_LT(max_err, 1e-13 * std::max(1.0, max_ref)) << "accumulated gradients differ";
}

TEST(Model, TrainingIsBitForBitDeterministic) {
  for (DType prec : {DType::F32, DType::BF16}) {
    std::vector<float> losses[2];
    std::vector<float> weights[2];
    for (int run = 0; run < 2; ++run) {
      auto be = make_cpu_backend();
      GPT2 m(tiny(), *be, prec);
      m.init_weights(3);
      std::vector<int32_t> tok, tgt;
      OptimConfig opt;
      opt.weight_decay = 0.1f;
      batch(tok, tgt, 2 * 11, 61, 100);  // one batch, so the loss must fall
      for (int s = 0; s < 4; ++s) {
        m.zero_grad();
        losses[run].push_back(m.forward(tok.data(), tgt.data(), 2, 11));
        m.backward();
        m.step(1e-2f, opt);
      }
      weights[run] = m.master_fp32();
    }
    EXPECT_EQ(0, std::memcmp(losses[0].data(), losses[1].data(), 4 * sizeof(float)))
        << dtype_name(prec);
    ASSERT_EQ(weights[0].size(), weights[1].size());
    EXPECT_EQ(0, std::memcmp(weights[0].data(), weights[1].data(), weights[0].size() * 4))
        << dtype_name(prec);
    EXPECT_LT(losses[0][3], losses[0][0]) << "loss did not fall on repeated steps";
  }
}

// forward_backward (one classifier pass for the loss and dlogits) is forward() then
// backward() bit for bit: losses, gradients and weights over steps of two micro-batches, in
// both accumulation modes and with FP16's loss scale; and backward() may not follow it.
TEST(Model, ForwardBackwardIsForwardThenBackward) {
  for (DType prec : {DType::F32, DType::BF16, DType::F16}) {
    for (GradAccumMode mode : {GradAccumMode::kFused, GradAccumMode::kSeparate}) {
      std::vector<double> losses[2], grads[2];
      std::vector<float> weights[2];
      for (int path = 0; path < 2; ++path) {
        auto be = make_cpu_backend();
        GPT2 m(tiny(), *be, prec);
        m.set_grad_accum_mode(mode);
        m.init_weights(3);
        std::vector<int32_t> tok, tgt;
        OptimConfig opt;
        opt.weight_decay = 0.1f;
        for (int s = 0; s < 3; ++s) {
          m.zero_grad();
          for (int a = 0; a < 2; ++a) {
            batch(tok, tgt, 2 * 11, 61, 300 + 2 * s + a);
            if (path == 0) {
              m.forward(tok.data(), tgt.data(), 2, 11);
              m.backward(2);
            } else {
              m.forward_backward(tok.data(), tgt.data(), 2, 11, 2);
              EXPECT_THROW(m.backward(2), Error);
            }
            losses[path].push_back(m.mean_loss());
          }
          const auto g = flat_grads(m);
          grads[path].insert(grads[path].end(), g.begin(), g.end());
          m.step(1e-2f, opt);
        }
        weights[path] = m.master_fp32();
      }
      const std::string what = std::string(dtype_name(prec)) +
                               (mode == GradAccumMode::kFused ? " fused" : " separate");
      EXPECT_EQ(losses[0], losses[1]) << what;
      EXPECT_TRUE(std::isfinite(losses[0].back()) && losses[0].back() > 0) << what;
      EXPECT_EQ(grads[0], grads[1]) << what;
      ASSERT_EQ(weights[0].size(), weights[1].size());
      EXPECT_EQ(0, std::memcmp(weights[0].data(), weights[1].data(), weights[0].size() * 4))
          << what;
    }
  }
}

// Recomputed activations are the forward's bits: losses, gradients and weights of a few
// steps are identical with and without recomputation, and less activation memory is held.
TEST(Model, RecomputationChangesMemoryNotBits) {
  const Recompute modes[] = {Recompute::kNone, Recompute::kGelu, Recompute::kGeluLayernorm};
  for (DType prec : {DType::F32, DType::BF16}) {
    std::vector<float> losses[3], weights[3];
    std::vector<double> grads[3];
    size_t bytes[3] = {};
    for (int r = 0; r < 3; ++r) {
      auto be = make_cpu_backend();
      GPT2 m(tiny(), *be, prec);
      m.set_recompute(modes[r]);
      m.init_weights(3);
      std::vector<int32_t> tok, tgt;
      OptimConfig opt;
      opt.weight_decay = 0.1f;
      for (int s = 0; s < 3; ++s) {
        batch(tok, tgt, 2 * 11, 61, 200 + s);
        m.zero_grad();
        losses[r].push_back(m.forward(tok.data(), tgt.data(), 2, 11));
        m.backward();
        if (s == 2) grads[r] = flat_grads(m);
        m.step(1e-2f, opt);
      }
      weights[r] = m.master_fp32();
      bytes[r] = m.activation_bytes();
      EXPECT_EQ(m.recompute(), modes[r]);
    }
    for (int r = 1; r < 3; ++r) {
      const char* name = recompute_name(modes[r]);
      EXPECT_EQ(0, std::memcmp(losses[0].data(), losses[r].data(), 3 * sizeof(float)))
          << dtype_name(prec) << " " << name;
      EXPECT_EQ(grads[0], grads[r]) << dtype_name(prec) << " " << name;
      ASSERT_EQ(weights[0].size(), weights[r].size());
      EXPECT_EQ(0, std::memcmp(weights[0].data(), weights[r].data(), weights[0].size() * 4))
          << dtype_name(prec) << " " << name;
    }
    // tiny(): L = 2, C = 24, B*T = 22; storage 4 bytes (FP32 storage on the CPU backend).
    const size_t btc = 22 * 24 * 4;
    EXPECT_EQ(bytes[0] - bytes[1], (2 - 1) * 4 * btc);      // one GELU output instead of L
    EXPECT_EQ(bytes[1] - bytes[2], 2 * (2 - 1) * btc);      // one ln1 and one ln2 buffer
  }
  EXPECT_EQ(parse_recompute("gelu_layernorm"), Recompute::kGeluLayernorm);
  EXPECT_THROW(parse_recompute("all"), Error);
}

TEST(Model, Bf16ModeKeepsParamsRoundedAndMasterFp32) {
  auto be = make_cpu_backend();
  GPT2 m(tiny(), *be, DType::BF16);
  m.init_weights(9);
  std::vector<int32_t> tok, tgt;
  batch(tok, tgt, 2 * 8, 61, 1);
  m.zero_grad();
  m.forward(tok.data(), tgt.data(), 2, 8);
  m.backward();
  m.step(1e-3f, OptimConfig{});
  int not_bf16 = 0, master_finer = 0;
  const std::vector<float> master = m.master_fp32();
  int64_t k = 0;
  for (int id = 0; id < kNumParams; ++id) {
    const Tensor p = m.param(id), g = m.grad(id);
    for (int64_t i = 0; i < p.numel(); ++i, ++k) {
      const float v = p.data<float>()[i];
      not_bf16 += round_bf16(v) != v || round_bf16(g.data<float>()[i]) != g.data<float>()[i];
      EXPECT_EQ(v, round_bf16(master[k]));
      master_finer += master[k] != v;
    }
  }
  EXPECT_EQ(not_bf16, 0) << "parameters or gradients hold values that are not BF16";
  EXPECT_GT(master_finer, m.num_params() / 2) << "master weights lost their FP32 bits";
}

TEST(Model, Fp16OverflowSkipsStepAndHalvesScale) {
  auto be = make_cpu_backend();
  LossScalerConfig ls;
  ls.init_scale = 16777216.0f;  // 2^24: dlogits of order 2^24 / (B*T) overflow FP16's 65504
  ls.growth_interval = 2;
  GPT2 m(tiny(), *be, DType::F16, AttentionConfig{}, ls);
  m.init_weights(4);
  const std::vector<float> before = m.master_fp32();
  std::vector<int32_t> tok, tgt;
  batch(tok, tgt, 2 * 8, 61, 2);
  m.zero_grad();
  m.forward(tok.data(), tgt.data(), 2, 8);
  m.backward();
  StepStats s = m.step(1e-3f, OptimConfig{});
  EXPECT_TRUE(s.skipped);
  EXPECT_EQ(m.loss_scaler().scale(), 8388608.0f);
  EXPECT_EQ(m.adam_step(), 0);
  EXPECT_EQ(before, m.master_fp32()) << "a skipped step changed the weights";
  // Keep going: the scale falls until gradients fit, then steps are taken.
  int taken = 0;
  for (int i = 0; i < 20 && taken < 3; ++i) {
    m.zero_grad();
    m.forward(tok.data(), tgt.data(), 2, 8);
    m.backward();
    s = m.step(1e-3f, OptimConfig{});
    taken += !s.skipped;
    if (!s.skipped) {
      EXPECT_TRUE(std::isfinite(s.grad_norm));
    }
  }
  EXPECT_EQ(taken, 3);
  EXPECT_LT(m.loss_scaler().scale(), 8388608.0f);
  // growth_interval = 2: after two clean steps the scale doubled once.
  EXPECT_NE(before, m.master_fp32());
}

TEST(Model, RejectsBadInput) {
  auto be = make_cpu_backend();
  GPT2Config bad = tiny();
  bad.n_embd = 25;  // not a multiple of n_head = 3
  EXPECT_THROW(GPT2(bad, *be, DType::F32), Error);
  GPT2 m(tiny(), *be, DType::F32);
  m.init_weights(1);
  std::vector<int32_t> tok(8, 3), tgt(8, 3);
  tok[5] = 61;  // outside the vocabulary
  EXPECT_THROW(m.forward(tok.data(), tgt.data(), 1, 8), Error);
  tok[5] = 3;
  tgt[2] = -1;
  EXPECT_THROW(m.forward(tok.data(), tgt.data(), 1, 8), Error);
  std::vector<int32_t> longer(17, 1);
  EXPECT_THROW(m.forward(longer.data(), longer.data(), 1, 17), Error);  // > max_seq_len
  EXPECT_THROW(m.backward(), Error);  // no successful forward with targets
}

TEST(Schedule, WarmupThenCosine) {
  LrSchedule s;
  s.lr = 1e-3f;
  s.min_lr = 1e-5f;
  s.warmup_steps = 10;
  s.max_steps = 110;
  EXPECT_FLOAT_EQ(s.at(0), 1e-4f);
  EXPECT_FLOAT_EQ(s.at(9), 1e-3f);
  EXPECT_FLOAT_EQ(s.at(10), 1e-3f);
  EXPECT_NEAR(s.at(60), 0.5 * (1e-3 + 1e-5), 1e-9);  // half-way through the cosine
  EXPECT_FLOAT_EQ(s.at(110), 1e-5f);
  EXPECT_FLOAT_EQ(s.at(500), 1e-5f);
  for (int i = 11; i < 110; ++i) EXPECT_LE(s.at(i), s.at(i - 1));
}

TEST(Model, Fp32FlashAndBaselineAgreeAtStepZero) {
  // Same weights, same batch: in FP32 the backends differ only in summation order and in
  // flash's online rescaling, so loss and every gradient agree to ~1e-6 relative.
  auto be = make_cpu_backend();
  std::vector<int32_t> tok, tgt;
  batch(tok, tgt, 2 * 16, 61, 8);
  std::vector<double> grads[3];
  double loss[3];
  const AttentionKind kinds[] = {AttentionKind::Baseline, AttentionKind::Flash,
                                 AttentionKind::StabilizedFlash};
  for (int i = 0; i < 3; ++i) {
    AttentionConfig ac;
    ac.kind = kinds[i];
    ac.block_q = 4;  // several tiles at T = 16, with masked ones
    ac.block_k = 8;
    GPT2 m(tiny(), *be, DType::F32, ac);
    m.init_weights(21);
    m.zero_grad();
    m.forward(tok.data(), tgt.data(), 2, 16);
    loss[i] = m.mean_loss();
    m.backward();
    grads[i] = flat_grads(m);
  }
  for (int i = 1; i < 3; ++i) {
    double num = 0, den = 0;
    for (size_t j = 0; j < grads[0].size(); ++j) {
      num += (grads[i][j] - grads[0][j]) * (grads[i][j] - grads[0][j]);
      den += grads[0][j] * grads[0][j];
    }
    const double rel = std::sqrt(num / den);
    std::printf("%s vs baseline: |loss diff| %.3e, gradient relative L2 diff %.3e\n",
                attention_kind_name(kinds[i]), std::fabs(loss[i] - loss[0]), rel);
    EXPECT_LT(std::fabs(loss[i] - loss[0]), 1e-6 * loss[0]);
    EXPECT_LT(rel, 3e-6);
    EXPECT_GT(rel, 0.0) << "identical bits: the backends did not really differ";
  }
}
