// Every layer's backward against central finite differences of its own forward, in FP64
// (the CPU backend's double instantiation: the same kernel code as FP32). The scalar
// probed is sum(w * out) with random w, so dout = w. Odd sizes throughout.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "model/gpt2.h"

using namespace st;

namespace {

constexpr DType F = DType::F64;

Tensor randn(const Shape& s, Rng& rng, double scale = 1.0, double shift = 0.0) {
  Tensor t = Tensor::empty(s, F);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = shift + scale * rng.normal();
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

// Compares analytic[i] with (loss(x+h) - loss(x-h)) / 2h for every element of x.
void check_grad(const char* what, const Tensor& x, const Tensor& analytic,
                const std::function<double()>& loss, double h = 1e-5, double rtol = 1e-6,
                double atol = 1e-9) {
  ASSERT_EQ(x.numel(), analytic.numel()) << what;
  double* p = x.data<double>();
  double max_err = 0, max_ref = 0;
  int bad = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = p[i];
    p[i] = v + h;
    const double lp = loss();
    p[i] = v - h;
    const double lm = loss();
    p[i] = v;
    const double fd = (lp - lm) / (2 * h);
    const double an = analytic.data<double>()[i];
    const double err = std::fabs(fd - an);
    max_err = std::max(max_err, err);
    max_ref = std::max(max_ref, std::fabs(fd));
    if (err > atol + rtol * std::fabs(fd) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << an << " vs finite difference "
                    << fd;
  }
  EXPECT_GT(max_ref, 0.0) << what << ": gradient is identically zero, nothing was tested";
  std::printf("  %-28s %6lld elements  max |fd - analytic| = %.3e  (max |grad| %.3e)\n", what,
              static_cast<long long>(x.numel()), max_err, max_ref);
}

class LayerFD : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  Rng rng{42};
};

}  // namespace

TEST_F(LayerFD, Matmul) {
  const int N = 7, C = 11, OC = 13;
  Tensor inp = randn({N, C}, rng), w = randn({OC, C}, rng), b = randn({OC}, rng);
  Tensor out = Tensor::empty({N, OC}, F), dout = randn({N, OC}, rng);
  auto loss = [&] {
    be->matmul_forward(out, inp, w, b, F);
    return dot(out, dout);
  };
  Tensor dinp = Tensor::empty({N, C}, F), dw = Tensor::zeros({OC, C}, F),
         db = Tensor::zeros({OC}, F);
  be->matmul_backward(dinp, dw, db, dout, inp, w, F);
  check_grad("matmul d(inp)", inp, dinp, loss);
  check_grad("matmul d(weight)", w, dw, loss);
  check_grad("matmul d(bias)", b, db, loss);
}

// Not a finite-difference test: the BF16 rounding points of dweight += dout^T . inp. The
// product is rounded before it is added to the gradient already there, and the sum is
// rounded again, as cuBLASLt's beta = 1 epilogue does on the GPU (layers/matmul_cpu.cpp).
// Operands in [1, 2) with N = 2 make every FP32 sum exact, so the two models are computed
// here exactly and the CPU must equal the twice-rounded one bit for bit.
TEST(MatmulRounding, DweightRoundsTheProductThenTheSumInBf16) {
  const int N = 2, C = 24, OC = 40;
  const DType bf = DType::BF16;
  Rng rng(7);
  auto fill = [&](Tensor& t, double lo, double hi) {
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = round_to(bf, static_cast<float>(lo + (hi - lo) * rng.uniform()));
  };
  Tensor dout = Tensor::empty({N, OC}, DType::F32), inp = Tensor::empty({N, C}, DType::F32);
  Tensor w = Tensor::empty({OC, C}, DType::F32), dw = Tensor::empty({OC, C}, DType::F32);
  fill(dout, 1, 2);
  fill(inp, 1, 2);
  fill(w, 1, 2);
  fill(dw, -8, 8);
  const std::vector<float> init(dw.data<float>(), dw.data<float>() + dw.numel());
  auto be = make_cpu_backend();
  be->matmul_backward(Tensor(), dw, Tensor(), dout, inp, w, bf);
  int64_t differ_from_once = 0;
  for (int o = 0; o < OC; ++o)
    for (int c = 0; c < C; ++c) {
      float sum = 0;  // exact: two products of 8-bit significands in [1, 4)
      for (int n = 0; n < N; ++n) sum += dout.data<float>()[n * OC + o] * inp.data<float>()[n * C + c];
      const float i0 = init[o * C + c];
      const float twice = round_to(bf, i0 + round_to(bf, sum));  // both sums exact in FP32
      const float once = round_to(bf, i0 + sum);
      const float got = dw.data<float>()[o * C + c];
      EXPECT_EQ(got, twice) << "dweight[" << o << "," << c << "]: init " << i0 << ", sum " << sum;
      differ_from_once += got != once;
    }
  // The two models must differ somewhere on these inputs, or the test shows nothing.
  EXPECT_GT(differ_from_once, OC * C / 20);
  std::printf("  dweight bf16: %lld of %d elements differ from the once-rounded model\n",
              static_cast<long long>(differ_from_once), OC * C);
}

TEST_F(LayerFD, Layernorm) {
  const int N = 6, C = 19;
  Tensor inp = randn({N, C}, rng, 2.0, 0.5), w = randn({C}, rng, 0.3, 1.0),
         b = randn({C}, rng, 0.1);
  Tensor out = Tensor::empty({N, C}, F), mean = Tensor::empty({N}, F),
         rstd = Tensor::empty({N}, F), dout = randn({N, C}, rng);
  auto loss = [&] {
    be->layernorm_forward(out, mean, rstd, inp, w, b, F);
    return dot(out, dout);
  };
  loss();
  Tensor dinp = Tensor::zeros({N, C}, F), dw = Tensor::zeros({C}, F), db = Tensor::zeros({C}, F);
  be->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, F);
  check_grad("layernorm d(inp)", inp, dinp, loss);
  check_grad("layernorm d(weight)", w, dw, loss);
  check_grad("layernorm d(bias)", b, db, loss);
}

TEST_F(LayerFD, GeluAndResidual) {
  const int n = 301;
  Tensor inp = randn({n}, rng, 2.0), out = Tensor::empty({n}, F), dout = randn({n}, rng);
  auto loss = [&] {
    be->gelu_forward(out, inp, F);
    return dot(out, dout);
  };
  Tensor dinp = Tensor::empty({n}, F);
  be->gelu_backward(dinp, inp, dout, F);
  check_grad("gelu d(inp)", inp, dinp, loss);

  Tensor a = randn({n}, rng), bb = randn({n}, rng);
  auto rloss = [&] {
    be->residual_forward(out, a, bb, F);
    return dot(out, dout);
  };
  check_grad("residual d(a)", a, dout, rloss);  // d/da (a + b) . dout = dout
  check_grad("residual d(b)", bb, dout, rloss);
}

TEST_F(LayerFD, Encoder) {
  const int B = 2, T = 5, C = 9, V = 11, maxT = 7;
  Tensor wte = randn({V, C}, rng), wpe = randn({maxT, C}, rng);
  Tensor tokens = Tensor::empty({B, T}, DType::I32);
  const int32_t tk[] = {3, 1, 3, 10, 0, 1, 1, 7, 3, 2};  // repeats exercise the scatter
  std::copy(tk, tk + B * T, tokens.data<int32_t>());
  Tensor out = Tensor::empty({B, T, C}, F), dout = randn({B, T, C}, rng);
  auto loss = [&] {
    be->encoder_forward(out, tokens, wte, wpe, F);
    return dot(out, dout);
  };
  Tensor dwte = Tensor::zeros({V, C}, F), dwpe = Tensor::zeros({maxT, C}, F);
  be->encoder_backward(dwte, dwpe, dout, tokens, F);
  check_grad("encoder d(wte)", wte, dwte, loss);
  check_grad("encoder d(wpe)", wpe, dwpe, loss);
}

TEST_F(LayerFD, CrossEntropy) {
  const int N = 5, V = 23, Vp = 32;
  Tensor logits = randn({N, Vp}, rng, 3.0), losses = Tensor::empty({N}, F);
  Tensor targets = Tensor::empty({N}, DType::I32);
  for (int i = 0; i < N; ++i) targets.data<int32_t>()[i] = (7 * i + 3) % V;
  const double dl = 0.37;
  auto loss = [&] {
    be->crossentropy_forward_backward(losses, Tensor(), logits, targets, V, 0.0f, F);
    double s = 0;
    for (int i = 0; i < N; ++i) s += losses.data<double>()[i];
    return dl * s;
  };
  loss();
  Tensor dlogits = Tensor::empty({N, Vp}, F);
  be->crossentropy_forward_backward(losses, dlogits, logits, targets, V, static_cast<float>(dl), F);
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) EXPECT_EQ(dlogits.data<double>()[i * Vp + j], 0.0);
  check_grad("crossentropy d(logits)", logits, dlogits, loss);
}

class AttentionFD : public ::testing::TestWithParam<AttentionKind> {};

TEST_P(AttentionFD, Qkv) {
  // T = 7 with 3-wide tiles: a partial last tile and, for early rows, fully masked tiles.
  auto be = make_cpu_backend();
  Rng rng(42 + static_cast<int>(GetParam()));
  const int B = 2, T = 7, NH = 3, C = 15;  // head size 5
  AttentionConfig cfg;
  cfg.kind = GetParam();
  cfg.block_q = 2;
  cfg.block_k = 3;
  auto attn = be->make_attention(cfg);
  Tensor qkv = randn({B, T, 3 * C}, rng), out = Tensor::empty({B, T, C}, F),
         lse = Tensor::empty({B, NH, T}, F), dout = randn({B, T, C}, rng);
  if (cfg.kind == AttentionKind::StabilizedFlash) {
    // Make keys 1 and 2 of batch 0, head 0 identical, so rows >= 2 have tied maxima
    // whenever they are the row's largest scores (exercises the max adjustment).
    for (int j = 0; j < 5; ++j) qkv.data<double>()[2 * 3 * C + C + j] = qkv.data<double>()[1 * 3 * C + C + j];
  }
  auto loss = [&] {
    attn->forward(out, lse, qkv, NH, F);
    return dot(out, dout);
  };
  loss();
  Tensor dqkv = Tensor::empty({B, T, 3 * C}, F);
  attn->backward(dqkv, dout, qkv, out, lse, NH, F);
  check_grad((std::string("attention d(qkv) ") + attention_kind_name(cfg.kind)).c_str(), qkv,
             dqkv, loss);
  // lse against a direct log-sum-exp of row t=3 of head 1, batch 1.
  const double scale = 1.0 / std::sqrt(5.0);
  const double* q = qkv.data<double>() + (1 * T + 3) * 3 * C + 1 * 5;
  double mx = -1e300, terms[7];
  for (int s = 0; s <= 3; ++s) {
    const double* k = qkv.data<double>() + (1 * T + s) * 3 * C + C + 1 * 5;
    double d = 0;
    for (int i = 0; i < 5; ++i) d += q[i] * k[i];
    terms[s] = d * scale;
    mx = std::max(mx, terms[s]);
  }
  double sum = 0;
  for (int s = 0; s <= 3; ++s) sum += std::exp(terms[s] - mx);
  EXPECT_NEAR(lse.data<double>()[(1 * NH + 1) * T + 3], mx + std::log(sum), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionFD,
                         ::testing::Values(AttentionKind::Baseline, AttentionKind::Flash,
                                           AttentionKind::StabilizedFlash),
                         [](const auto& info) { return std::string(attention_kind_name(info.param)); });

TEST(ModelFD, WholeGpt2Fp64) {
  auto be = make_cpu_backend();
  GPT2Config cfg;
  cfg.vocab_size = 37;
  cfg.max_seq_len = 8;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 10;
  GPT2 model(cfg, *be, DType::F64);
  model.init_weights(7);
  // Make biases and layernorm parameters non-trivial so their paths are exercised.
  Rng rng(3);
  for (int id : {kLn1b, kQkvb, kAttprojb, kLn2w, kFcb, kFcprojb, kLnfb}) {
    Tensor p = model.param(id);
    for (int64_t i = 0; i < p.numel(); ++i) p.data<double>()[i] += 0.1 * rng.normal();
  }
  const int B = 2, T = 6;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) {
    tok[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
    tgt[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
  }
  auto loss = [&] {
    model.forward(tok.data(), tgt.data(), B, T);
    return model.mean_loss();
  };
  loss();
  model.zero_grad();
  model.backward();
  for (int id = 0; id < kNumParams; ++id) {
    Tensor p = model.param(id), g = model.grad(id);
    // Padded vocabulary rows get no gradient; check only the real rows of wte.
    if (id == kWte) {
      p = p.slice(0, cfg.vocab_size);
      g = g.slice(0, cfg.vocab_size);
    }
    if (id == kWpe) {  // positions >= T are unused
      p = p.slice(0, T);
      g = g.slice(0, T);
    }
    check_grad(param_name(id), p, g, loss, 1e-5, 1e-5, 1e-9);
  }
}
