// bench attention, table 4 (see bench_attention.cpp): the delta modes of the flash backward,
// each mode's backward time and the mean signed error of its delta against FP64 on
// tied-maximum rows (the construction of attention/experiments.cpp), with the accumulator in
// FP32 and in the compute format. It reads the delta back with flash_cuda_last_delta, so the
// table is a CUDA build's; a CPU-only build prints a note in its place.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "apps/bench_attention.h"
#if defined(ST_WITH_CUDA)
#include "cuda/flash_attention.h"
#endif

namespace st::attn_bench {

#if defined(ST_WITH_CUDA)
namespace {

// Tied-maximum inputs and the FP64 delta (see bench_attention.cpp's header and tests/test_gpu_flash.cpp).
struct TiedInputs {
  int B, NH, T;
  Tensor qkv, dout_ones, dout_normal;  // host FP32 holding bf16 values
};

TiedInputs tied_inputs(int B, int NH, int T, uint64_t seed) {
  const int d = 64, C = NH * d, bc = 64;
  const double top = 5.0, v_mean = -1.5, v_std = 0.2;
  TiedInputs in{B, NH, T, Tensor::zeros({B, T, 3 * C}, DType::F32),
                Tensor::empty({B, T, C}, DType::F32), Tensor::empty({B, T, C}, DType::F32)};
  float* a = in.qkv.data<float>();
  Rng rng(seed);
  auto at = [&](int b, int t, int which, int h, int j) -> float& {
    return a[(static_cast<size_t>(b) * T + t) * 3 * C + which * C + h * d + j];
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      for (int r = 0; r < 32; ++r) {
        const int c0 = static_cast<int>(rng.below(T / bc)) * bc;
        const int p0 = c0 + static_cast<int>(rng.below(bc));
        int p1;
        do p1 = c0 + static_cast<int>(rng.below(bc));
        while (p1 == p0);
        at(b, r, 0, h, 2 * r) = at(b, r, 0, h, 2 * r + 1) = 1.0f;
        for (int s = 0; s < T; ++s) {
          const double S = (s == p0 || s == p1) ? top : top - (12 + 8 * rng.uniform());
          const float hi = round_bf16(static_cast<float>(8 * S));
          at(b, s, 1, h, 2 * r) = hi;
          at(b, s, 1, h, 2 * r + 1) = round_bf16(static_cast<float>(8 * S - hi));
        }
      }
      for (int s = 0; s < T; ++s)
        for (int j = 0; j < d; ++j)
          at(b, s, 2, h, j) = round_bf16(static_cast<float>(v_mean + v_std * rng.normal()));
    }
  std::fill(in.dout_ones.data<float>(), in.dout_ones.data<float>() + in.dout_ones.numel(), 1.0f);
  for (int64_t i = 0; i < in.dout_normal.numel(); ++i)
    in.dout_normal.data<float>()[i] = round_bf16(static_cast<float>(rng.normal()));
  return in;
}

// Exact delta = dO . O (O in FP64 from the exact scores (hi + lo) / 8) of the counted rows
// (r < 32 of each (b, h)), in (b, h, r) order.
std::vector<double> tied_reference_delta(const TiedInputs& in, const Tensor& dout) {
  const int d = 64, C = in.NH * d, T = in.T;
  const float* a = in.qkv.data<float>();
  const float* g = dout.data<float>();
  std::vector<double> out;
  std::vector<double> S(T), o(d);
  for (int b = 0; b < in.B; ++b)
    for (int h = 0; h < in.NH; ++h)
      for (int r = 0; r < 32; ++r) {
        double mx = -1e300;
        for (int s = 0; s < T; ++s) {
          const float* k = a + (static_cast<size_t>(b) * T + s) * 3 * C + C + h * d;
          S[s] = (static_cast<double>(k[2 * r]) + k[2 * r + 1]) * 0.125;
          mx = std::max(mx, S[s]);
        }
        double Z = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (int s = 0; s < T; ++s) {
          const double e = std::exp(S[s] - mx);
          Z += e;
          const float* v = a + (static_cast<size_t>(b) * T + s) * 3 * C + 2 * C + h * d;
          for (int j = 0; j < d; ++j) o[j] += e * v[j];
        }
        double delta = 0;
        for (int j = 0; j < d; ++j)
          delta += static_cast<double>(g[(static_cast<size_t>(b) * T + r) * C + h * d + j]) * o[j] / Z;
        out.push_back(delta);
      }
  return out;
}

}  // namespace

void delta_mode_table(Backend& be, const AttnBenchArgs& a, DType fmt, int d) {
  const int H = a.width / d, T = a.delta_T, B = a.tokens / T;
  const DeltaMode modes[] = {DeltaMode::O, DeltaMode::OSplit, DeltaMode::OFp32, DeltaMode::DpP};
  // Speed of each mode's backward (delta pass + dK/dV + dQ).
  std::vector<double> bwd_ms;
  {
    const int64_t n3 = static_cast<int64_t>(B) * T * 3 * a.width;
    Tensor h_qkv = Tensor::empty({n3}, DType::F32), h_do = Tensor::empty({n3 / 3}, DType::F32);
    Rng rng(99);
    for (int64_t i = 0; i < n3; ++i) h_qkv.data<float>()[i] = static_cast<float>(rng.normal());
    for (int64_t i = 0; i < n3 / 3; ++i) h_do.data<float>()[i] = static_cast<float>(rng.normal());
    Problem p{B, T, H, d, be.alloc({B, T, 3 * a.width}, fmt), be.alloc({B, T, a.width}, fmt),
              be.alloc({B, T, a.width}, fmt), be.alloc({B, H, T}, DType::F32),
              be.alloc({B, T, 3 * a.width}, fmt)};
    be.copy(p.qkv, h_qkv.view({B, T, 3 * a.width}));
    be.copy(p.dout, h_do.view({B, T, a.width}));
    for (DeltaMode m : modes) {
      AttentionConfig cfg;
      cfg.kind = AttentionKind::Flash;
      tiles_for(a, d, cfg.block_q, cfg.block_k);
      cfg.delta = m;
      const Timing t = time_method(be, cfg, p, fmt, a);
      bwd_ms.push_back(t.ok ? t.bwd : -1);
      if (!t.ok) std::fprintf(stderr, "bench attention: delta %s: %s\n", delta_mode_name(m), t.error.c_str());
    }
  }
  // Accuracy on tied-maximum rows (2048 rows: B 4 x NH 16 x 32, T = 512, head dim 64).
  const TiedInputs ti = tied_inputs(4, 16, 512, 7);
  const std::vector<double> ref_ones = tied_reference_delta(ti, ti.dout_ones);
  const std::vector<double> ref_norm = tied_reference_delta(ti, ti.dout_normal);
  const int C = ti.NH * 64;
  Problem p{ti.B, ti.T, ti.NH, 64, be.alloc({ti.B, ti.T, 3 * C}, DType::BF16), be.alloc({ti.B, ti.T, C}, DType::BF16),
            be.alloc({ti.B, ti.T, C}, DType::BF16), be.alloc({ti.B, ti.NH, ti.T}, DType::F32),
            be.alloc({ti.B, ti.T, 3 * C}, DType::BF16)};
  be.copy(p.qkv, ti.qkv);
  std::printf("\n## Delta modes (flash, d = %d, T = %d: backward time; tied-maximum rows: mean signed "
              "delta error vs FP64 +- SE over %zu rows, non-causal, bf16)\n\n",
              d, T, ref_ones.size());
  std::printf("| delta | bwd ms | bwd TFLOP/s | accum | err dO=1 | SE | err dO~N(0,1) | SE |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (size_t mi = 0; mi < 4; ++mi)
    for (DType acc : {DType::F32, DType::BF16}) {
      double mean[2] = {0, 0}, se[2] = {0, 0};
      bool ok = true;
      for (int k = 0; k < 2; ++k) {
        try {
          AttentionConfig cfg;
          cfg.kind = AttentionKind::Flash;
          cfg.causal = false;
          cfg.delta = modes[mi];
          if (acc != DType::F32) cfg.accum = acc;
          auto attn = be.make_attention(cfg);
          be.copy(p.dout, k == 0 ? ti.dout_ones : ti.dout_normal);
          attn->forward(p.out, p.lse, p.qkv, ti.NH, DType::BF16);
          attn->backward(p.dqkv, p.dout, p.qkv, p.out, p.lse, ti.NH, DType::BF16);
          const std::vector<float> g = flash_cuda_last_delta(*attn);
          const std::vector<double>& ref = k == 0 ? ref_ones : ref_norm;
          std::vector<double> e;
          size_t i = 0;
          for (int b = 0; b < ti.B; ++b)
            for (int h = 0; h < ti.NH; ++h)
              for (int r = 0; r < 32; ++r, ++i)
                e.push_back(g[(static_cast<size_t>(b) * ti.NH + h) * ti.T + r] - ref[i]);
          double s = 0, ss = 0;
          for (double x : e) s += x;
          mean[k] = s / e.size();
          for (double x : e) ss += (x - mean[k]) * (x - mean[k]);
          se[k] = std::sqrt(ss / (e.size() - 1) / e.size());
        } catch (const std::exception& ex) {
          std::fprintf(stderr, "bench attention: delta %s: %s\n", delta_mode_name(modes[mi]), ex.what());
          ok = false;
        }
      }
      const double f = 2.5 * fwd_flops(B, T, H, d, true);
      std::printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", delta_mode_name(modes[mi]),
                  bwd_ms[mi] > 0 ? fmt_num(bwd_ms[mi], "%.3f").c_str() : "-",
                  bwd_ms[mi] > 0 ? fmt_num(f / (bwd_ms[mi] * 1e9)).c_str() : "-", dtype_name(acc),
                  ok ? fmt_num(mean[0], "%+.3e").c_str() : "-", ok ? fmt_num(se[0], "%.1e").c_str() : "-",
                  ok ? fmt_num(mean[1], "%+.3e").c_str() : "-", ok ? fmt_num(se[1], "%.1e").c_str() : "-");
    }
}
#else
void delta_mode_table(Backend&, const AttnBenchArgs&, DType, int) {
  std::printf("\n(delta modes: needs a CUDA build)\n");
}
#endif

}  // namespace st::attn_bench
