// The GPU parity table's cases (label gpu; part of test_gpu_kernels, run by
// test_gpu_kernels_parity.cpp): for every Backend method, the tensors it takes, how each is
// drawn and the tolerance of each output, with the reason at each entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda/cuda_backend.h"
#include "cuda/stochastic_round.h"
#include "gpu_test_util.h"
#include "test_gpu_kernels.h"

namespace st::gpu_kernels {

// ---------------------------------------------------------------- parity table
//
// Every Backend method, CUDA against the CPU backend (make_backend("cpu"), the executable
// specification) in the same precision mode (fp32, bf16, fp16), on fresh random inputs that
// are never zero and are already representable in the compute format (so both backends see
// the same values). Outputs that a method overwrites are poisoned with NaN before the call;
// "+=" outputs start from the same random values on both sides. Every GPU tensor is a view
// with guard elements before and after it, which must be unchanged afterwards, and GPU
// inputs must be unchanged too. Per output: max abs error, max relative error, the
// norm-wise relative error and the largest error in ulps are printed ("parity ..." lines),
// the norm must be non-zero and every element finite, a "+=" output must have changed, and
// each element must satisfy |gpu - cpu| <= ulps * ulp(cpu) + floor * max|cpu| (or be
// bit-identical where the tolerance is exact), with the reason at each table entry.


Spec in(std::string n, Shape s, double scale = 1.0, double shift = 0.0) {
  return Spec{std::move(n), std::move(s), Kind::Act, Init::In, scale, shift};
}
Spec out(std::string n, Shape s, Tol tol) {
  Spec x{std::move(n), std::move(s), Kind::Act, Init::Poison};
  x.tol = tol;
  return x;
}
Spec acc(std::string n, Shape s, Tol tol, double scale = 0.1) {
  Spec x{std::move(n), std::move(s), Kind::Act, Init::Accum, scale};
  x.tol = tol;
  return x;
}
Spec f32(Spec s) {
  s.kind = Kind::F32;
  return s;
}

std::vector<Case> make_cases(const Cfg& z, DType fmt) {
  const int64_t B = z.B, T = z.T, C = z.C, OC = z.OC, N = z.B * z.T, R = z.cls_rows;
  const bool f16 = fmt == DType::F16;
  std::vector<Case> cs;
  auto add = [&](std::string method, std::string variant, std::vector<Spec> specs, RunFn run) {
    Case c;
    c.method = std::move(method);
    c.variant = std::move(variant);
    c.specs = std::move(specs);
    c.run = std::move(run);
    cs.push_back(std::move(c));
    return &cs.back();
  };
  auto none = std::vector<double>{};

  // ---- memory
  add("zero", "", {[&] {
        Spec s = acc("t", {N, C}, kExact);
        s.nonzero = false;
        return s;
      }()},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
        be.zero(t[0]);
        return none;
      });
  add("copy", "device to device", {out("dst", {N, C}, kExact), in("src", {N, C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
        be.copy(t[0], t[1]);
        return none;
      });
  // fp32 master -> compute copy: one RNE rounding on both (CPU: FP32 storage rounded in place).
  add("round_copy", "fp32 -> fmt", {out("dst", {N, C}, kExact), f32(in("src", {N, C}, 0.3))},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.round_copy(t[0], t[1], f);
        return none;
      });

  // ---- encoder: the same FP32 add / the same sums in the same order as the CPU: exact.
  {
    Case* c = add(
        "encoder_forward", "",
        {out("out", {B, T, C}, kExact), in("wte", {z.rows, C}, 0.1), in("wpe", {z.maxT, C}, 0.02)},
        [=](Backend& be, const std::vector<Tensor>& t, const Tensor& tok, DType f) {
          be.encoder_forward(t[0], tok, t[1], t[2], f);
          return none;
        });
    c->ints_shape = {B, T};
    c->ints_range = z.rows;
    c = add("encoder_backward", "",
            {acc("dwte", {z.rows, C}, kExact, 0.01), acc("dwpe", {z.maxT, C}, kExact, 0.01),
             in("dout", {B, T, C}, 0.1)},
            [=](Backend& be, const std::vector<Tensor>& t, const Tensor& tok, DType f) {
              be.encoder_backward(t[0], t[1], t[2], tok, f);
              return none;
            });
    c->ints_shape = {B, T};
    c->ints_range = -z.rows;  // negative: half the ids from 8 frequent tokens (repeats)
  }

  // ---- layernorm
  // The row mean and variance are summed in another order (lane-strided + butterfly vs the
  // CPU's sequential loop): FP32 reassociation. The CPU's own sequential error dominates:
  // ~sqrt(C) 2^-24 relative for the sum of squares (rstd: ~5e-7 at C = 768, hence 32 FP32
  // ulps) and, for the mean of rows with a non-zero mean, up to C 2^-24 mean|x| in the worst
  // case (the floor: 1e-5 of the largest mean). out: an FP32 value a few ulps off may round
  // to the neighbouring bf16/fp16 value (1 ulp); the floor absorbs x - mean cancelling.
  add("layernorm_forward", "",
      {out("out", {B, T, C}, close_to(1, 8, 4e-6)), f32(out("mean", {B, T}, close_to(0, 8, 1e-5))),
       f32(out("rstd", {B, T}, close_to(0, 32, 0))), in("inp", {B, T, C}, 1.0, 0.3),
       in("weight", {C}, 0.1, 1.0), in("bias", {C}, 0.1)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], f);
        return none;
      });
  // The residual add fused into the layernorm forward: res exact (one add, one rounding),
  // out/mean/rstd as layernorm_forward (the emu suite checks the fused kernel is bit-identical
  // to the unfused pair).
  add("residual_layernorm_forward", "",
      {out("res", {B, T, C}, kExact), out("out", {B, T, C}, close_to(1, 8, 4e-6)),
       f32(out("mean", {B, T}, close_to(0, 8, 1e-5))), f32(out("rstd", {B, T}, close_to(0, 32, 0))),
       in("a", {B, T, C}, 1.0, 0.3), in("b", {B, T, C}, 0.5), in("weight", {C}, 0.1, 1.0),
       in("bias", {C}, 0.1)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.residual_layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], f);
        return none;
      });
  const Spec rstd_in = [&] {
    Spec s = f32(in("rstd", {B, T}, 0.1, 1.0));
    s.positive = true;
    return s;
  }();
  // dinp: the two row sums are reassociated (as forward) and the result cancels (dn - mean
  // - n*mean): floor 2e-6 of the largest gradient. dweight/dbias: column sums over N rows in
  // chunks of 64 (exact when N <= 64), FP32 reassociation over up to N terms.
  add("layernorm_backward", "",
      {acc("dinp", {B, T, C}, close_to(1, 16, 2e-6)), acc("dweight", {C}, close_to(1, 16, 1e-5)),
       acc("dbias", {C}, close_to(1, 16, 1e-5)), in("dout", {B, T, C}, 0.1),
       in("inp", {B, T, C}, 1.0, 0.3), in("weight", {C}, 0.1, 1.0),
       f32(in("mean", {B, T}, 0.05, 0.3)),
       rstd_in},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], f);
        return none;
      });

  // ... and with the next projection's bias gradient made in its pass: dnext = colsum of the
  // dinp it leaves (bias_backward's chunks vs the CPU's row order; dinp's own tolerance).
  add("layernorm_backward_dbias", "",
      {acc("dinp", {B, T, C}, close_to(1, 16, 2e-6)), acc("dweight", {C}, close_to(1, 16, 1e-5)),
       acc("dbias", {C}, close_to(1, 16, 1e-5)), acc("dnext", {C}, close_to(1, 64, 1e-5)),
       in("dout", {B, T, C}, 0.1), in("inp", {B, T, C}, 1.0, 0.3), in("weight", {C}, 0.1, 1.0),
       f32(in("mean", {B, T}, 0.05, 0.3)),
       rstd_in},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.layernorm_backward_dbias(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], f);
        return none;
      });

  // ---- matmul (cuBLASLt vs OpenBLAS): both accumulate in FP32 and round once, in different
  // orders (and cuBLASLt with FMA): bf16/fp16 results at most 1 ulp apart; FP32 results
  // within 2e-5 of the largest output (the typical reassociation error is ~1e-7 of it).
  const Tol kGemm = close_to(1, 4, 2e-5);
  for (bool bias : {true, false}) {
    Case* c = add("matmul_forward", bias ? "+bias" : "no bias",
                  {out("out", {B, T, OC}, kGemm), in("inp", {B, T, C}), in("weight", {OC, C}, 0.05),
                   in("bias", {OC}, 0.5)},
                  [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
                    be.matmul_forward(t[0], t[1], t[2], bias ? t[3] : Tensor(), f);
                    return none;
                  });
    c->gemm = true;
  }
  // dbias: the column-sum kernel (chunks of 64 rows, then the chunks) vs the CPU's row order.
  // dweight = round(dweight + round(product)) on both sides (layers/matmul_cpu.cpp): the
  // product's FP32 sums differ in order, so round(product) may land on its neighbour (one
  // ulp of the product) in the rare near-ties; a different rounding model (once instead of
  // twice) would move about a quarter of the elements, hence at most 1% may differ. That
  // count belongs to BF16/FP16 alone: in FP32 nothing is rounded to a coarser format, the
  // summation order alone makes most elements differ in their last bits (74-90% on the
  // H200), and FP32 keeps its ulp + norm bound.
  Tol kGemmAcc = kGemm;
  kGemmAcc.addend_ulps = 1;
  if (fmt != DType::F32) kGemmAcc.max_differ = 0.01;
  for (int v = 0; v < 3; ++v) {
    const bool dinp = v != 2, dbias = v != 1;
    std::vector<Spec> s = {out("dinp", {B, T, C}, kGemm),
                           acc("dweight", {OC, C}, kGemmAcc, 0.01),
                           acc("dbias", {OC}, close_to(1, 16, 1e-5)),
                           in("dout", {B, T, OC}, 0.1),
                           in("inp", {B, T, C}),
                           in("weight", {OC, C}, 0.05)};
    if (!dinp) s[0] = in("dinp (unused)", {1});
    if (!dbias) s[2] = in("dbias (unused)", {1});
    Case* c = add("matmul_backward",
                  v == 0   ? "full"
                  : v == 1 ? "no dbias"
                           : "no dinp",
                  s, [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
                    be.matmul_backward(dinp ? t[0] : Tensor(), t[1], dbias ? t[2] : Tensor(), t[3],
                                       t[4], t[5], f);
                    return none;
                  });
    c->gemm = true;
  }

  // ---- elementwise
  // GELU: the CPU's formula operation for operation, but tanhf (CUDA, <= 2 ulp) and the CPU's
  // tanh (layers/vec_math.h, <= 0.501 ulp) may differ in the last FP32 bits, which can move a bf16/fp16 rounding by 1 ulp; the floor
  // covers 1 + tanh(u) cancelling for large negative x.
  add("gelu_forward", "",
      {out("out", {N, 4 * C}, close_to(1, 8, 1e-6)), in("inp", {N, 4 * C}, 2.0)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_forward(t[0], t[1], f);
        return none;
      });
  // Backward: also 1 - tanh^2 cancels, hence the larger floor.
  const Tol kGeluB = close_to(1, 16, 4e-6);
  add("gelu_backward", "",
      {out("dinp", {N, 4 * C}, kGeluB), in("inp", {N, 4 * C}, 2.0), in("dout", {N, 4 * C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_backward(t[0], t[1], t[2], f);
        return none;
      });
  add("gelu_backward", "in place (dinp = dout)",
      {acc("dout", {N, 4 * C}, kGeluB, 1.0), in("inp", {N, 4 * C}, 2.0)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_backward(t[0], t[1], t[0], f);
        return none;
      });
  // The fc bias gradient made in the GELU backward's pass: dinp as gelu_backward; dbias the
  // column sums of dinp (bias_backward's chunks vs the CPU's row order, over values that may
  // each differ by the GELU tolerance). The emu suite checks it is bit-identical to the pair.
  const Tol kGeluDbias = close_to(1, 64, 1e-5);
  add("gelu_backward_dbias", "",
      {out("dinp", {N, 4 * C}, kGeluB), acc("dbias", {4 * C}, kGeluDbias, 0.1),
       in("inp", {N, 4 * C}, 2.0), in("dout", {N, 4 * C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_backward_dbias(t[0], t[1], t[2], t[3], f);
        return none;
      });
  add("gelu_backward_dbias", "in place (dinp = dout)",
      {acc("dout", {N, 4 * C}, kGeluB, 1.0), acc("dbias", {4 * C}, kGeluDbias, 0.1),
       in("inp", {N, 4 * C}, 2.0)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.gelu_backward_dbias(t[0], t[1], t[2], t[0], f);
        return none;
      });
  // matmul_backward's dbias alone: the column-sum kernel vs the CPU's row order.
  add("bias_backward", "",
      {acc("dbias", {OC}, close_to(1, 16, 1e-5), 0.1), in("dout", {B, T, OC}, 0.1)},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.bias_backward(t[0], t[1], f);
        return none;
      });
  // One FP32 add, one rounding: exact.
  add("residual_forward", "",
      {out("out", {B, T, C}, kExact), in("a", {B, T, C}), in("b", {B, T, C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.residual_forward(t[0], t[1], t[2], f);
        return none;
      });
  add("residual_forward", "in place (out = a)",
      {acc("a", {B, T, C}, kExact, 1.0), in("b", {B, T, C})},
      [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
        be.residual_forward(t[0], t[0], t[1], f);
        return none;
      });

  // ---- classifier: the softmax sum is reduced in a block tree (vs the CPU's sequential loop
  // over V = 50257 terms, whose own error is ~1e-6..1e-5 relative) and expf/logf may differ
  // from glibc's in the last bit. losses: 16 FP32 ulps plus 4e-6 of the largest loss;
  // dlogits: 1 bf16/fp16 ulp; in FP32 the relative error of 1/sum carries into every
  // probability, covered by the floor (every p is far below the -1 of the target entries).
  const float dloss = (f16 ? 1024.0f : 1.0f) / static_cast<float>(R);  // fp16: loss-scaled
  const Tol kLoss = close_to(0, 16, 4e-6), kDlogits = close_to(1, 16, 1e-6);
  for (int v = 0; v < 3; ++v) {
    std::vector<Spec> s;
    if (v == 0)
      s = {f32(out("losses", {R}, kLoss)), out("dlogits", {R, z.Vp}, kDlogits),
           in("logits", {R, z.Vp}, 2.0)};
    if (v == 1)
      s = {f32(out("losses", {R}, kLoss)), acc("logits -> dlogits", {R, z.Vp}, kDlogits, 2.0)};
    if (v == 2) s = {f32(out("losses", {R}, kLoss)), in("logits", {R, z.Vp}, 2.0)};
    const int V = static_cast<int>(z.V);
    Case* c = add("crossentropy_forward_backward",
                  v == 0   ? "separate dlogits"
                  : v == 1 ? "in place (dlogits = logits)"
                           : "forward only",
                  s, [=](Backend& be, const std::vector<Tensor>& t, const Tensor& tg, DType f) {
                    if (v == 0) be.crossentropy_forward_backward(t[0], t[1], t[2], tg, V, dloss, f);
                    if (v == 1) be.crossentropy_forward_backward(t[0], t[1], t[1], tg, V, dloss, f);
                    if (v == 2)
                      be.crossentropy_forward_backward(t[0], Tensor(), t[1], tg, V, dloss, f);
                    return none;
                  });
    c->ints_shape = {R};
    c->ints_range = z.V;
  }

  // ---- reductions
  // sum_squares: the CPU's 64K chunks, FP64 sums in another order inside them; every square
  // is exact in FP64, so the relative difference is below 2 n 2^-53 (positive terms).
  {
    const int64_t n = N * C;
    Case* c = add("sum_squares", "", {in("x", {n})},
                  [](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
                    return std::vector<double>{be.sum_squares(t[0])};
                  });
    c->scalar_rel = 2.0 * static_cast<double>(n) * std::ldexp(1.0, -53);
    c = add("sum_squares", "fp32 tensor", {f32(in("x", {n}, 1e-3))},
            [](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
              return std::vector<double>{be.sum_squares(t[0])};
            });
    c->scalar_rel = 2.0 * static_cast<double>(n) * std::ldexp(1.0, -53);
  }
  // all_finite: a boolean, exact; Inf (as an fp16 overflow would leave) and NaN planted at
  // the two ends.
  for (int v = 0; v < 3; ++v) {
    Spec x = in("x", {N, C});
    x.planted = v != 0;
    add("all_finite",
        v == 0   ? "finite"
        : v == 1 ? "Inf last"
                 : "NaN first",
        {x}, [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType) {
          const int64_t n = t[0].numel();
          Tensor one = Tensor::empty({1}, DType::F32);
          one.data<float>()[0] = v == 1 ? INFINITY : NAN;
          if (v != 0) be.copy(t[0].view({n}).flat(v == 1 ? n - 1 : 0, 1, {1}), one);
          return std::vector<double>{be.all_finite(t[0]) ? 1.0 : 0.0};
        });
  }

  // ---- AdamW: the CPU's operations in the CPU's order (host-side scalars by the same
  // expressions, IEEE sqrt and division, no FMA): master, m, v and the compute copy exact.
  {
    const int64_t n = 37 * C + 5;
    std::vector<Spec> s = {f32(acc("master", {n}, kExact, 0.05)), f32(acc("m", {n}, kExact, 1e-3)),
                           [&] {
                             Spec x = f32(acc("v", {n}, kExact, 1e-5));
                             x.positive = true;
                             return x;
                           }(),
                           in("grad", {n}, f16 ? 100.0 : 0.01)};
    const bool separate = fmt != DType::F32;  // fp32: the compute copy is master itself
    if (separate) s.push_back(out("param", {n}, kExact));
    add("adamw_update", separate ? "separate compute copy" : "param = master", s,
        [=](Backend& be, const std::vector<Tensor>& t, const Tensor&, DType f) {
          AdamWArgs a;
          a.lr = 1e-3f;
          a.beta1 = 0.9f;
          a.beta2 = 0.95f;
          a.eps = 1e-8f;
          a.weight_decay = 0.1f;
          a.step = 7;
          a.grad_scale = f16 ? 1.0f / 1024.0f : 0.8f;
          be.adamw_update(t[0], separate ? t[4] : t[0], t[3], t[1], t[2], a, f);
          return none;
        });
  }
  return cs;
}

}  // namespace st::gpu_kernels
