// The CUDA backend's kernels (cuda/*.cu, compiled as host C++) run by the SIMT emulator
// through their own host launchers (cuda/kernels.h, cuda/attention_softmax.h), on host
// buffers, against the CPU backend (backends/cpu_backend.cpp) on the same inputs. Label emu.
// The baseline attention's softmax row kernels are in test_simt_kernels_softmax.cpp (same
// executable), the helpers both use in simt_kernels_test_util.h.
//
// Inputs are random, non-zero and already representable in the compute format; outputs
// the kernels overwrite start as poison (0xFF bytes: NaN) so unwritten elements show. Each case
// runs under two schedules (seeds 1 and 2: other thread interleavings and block orders),
// which must give identical bits, and must pass the emulator's shared-memory checks.
// Tolerances: "exact" where the kernel does the CPU's operations in the CPU's order;
// otherwise a bound in ulps of the output format plus a floor relative to the largest
// reference value, with the reason beside each (the same reasons as tests/test_gpu_kernels).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda/attention_softmax.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "simt/simt.h"
#include "simt/simt_kernels_test_util.h"
#include "simt/simt_test_util.h"

namespace st {
namespace {

using namespace simt_kernels;

// ---------------------------------------------------------------- encoder

TEST_P(SimtKernels, Encoder) {
  const DType f = GetParam();
  const int B = 3, T = 37, C = 100, V = 67;  // odd sizes: the scalar paths and tails
  auto wte = randv(size_t{V} * C, f, 1, 0.1), wpe = randv(size_t{T} * C, f, 2, 0.02);
  Tensor tok = Tensor::empty({B, T}, DType::I32);
  int32_t* tk = static_cast<int32_t*>(tok.raw());
  for (int i = 0; i < B * T; ++i) tk[i] = (i * 7919) % 11 == 0 ? 5 : (i * 31) % V;  // repeats
  Tensor out = Tensor::empty({B, T, C}, DType::F32);
  cpu_->encoder_forward(out, tok, host(wte, {V, C}), host(wpe, {T, C}), f);
  auto got = two_schedules([&] {
    Buf o(f, size_t{B} * T * C), a = dev(wte, f), b = dev(wpe, f);
    cudak::encoder_forward(o.p(), tk, a.p(), b.p(), B, T, C, f, nullptr);
    return std::vector<Buf>{o};
  });
  compare("encoder_forward out", got[0], values(out), f, kExact);

}

// The backward groups the positions by token with a stable radix sort on the device (1 to
// 3 passes of 8 bits here); the sums are then the CPU's, in the CPU's order: exact. Shapes:
// one partial tile, several tiles with a partial last one, a single position, tokens past
// 2^16 (three passes) with one token filling most of the batch.
TEST_P(SimtKernels, EncoderBackwardSortsOnTheDevice) {
  const DType f = GetParam();
  struct Case {
    int B, T, C, V;
    int pattern;  // 0: strided repeats, 1: few distinct tokens, 2: one token dominating
  };
  for (const Case& k : {Case{3, 37, 100, 67, 0}, Case{4, 300, 40, 1000, 1}, Case{1, 1, 8, 3, 0},
                        Case{2, 150, 16, 70000, 2}}) {
    const int n = k.B * k.T;
    Tensor tok = Tensor::empty({k.B, k.T}, DType::I32);
    int32_t* tk = static_cast<int32_t*>(tok.raw());
    Rng r(static_cast<uint64_t>(k.V));
    for (int i = 0; i < n; ++i) {
      if (k.pattern == 0) tk[i] = (i * 7919) % 11 == 0 ? k.V - 1 : (i * 31) % k.V;
      if (k.pattern == 1) tk[i] = i % 3 == 0 ? static_cast<int32_t>(r.below(40)) * 23 + 7
                                             : static_cast<int32_t>(r.below(k.V));
      if (k.pattern == 2) tk[i] = i % 5 == 4 ? static_cast<int32_t>(r.below(k.V)) : 65537;
    }
    SCOPED_TRACE("B=" + std::to_string(k.B) + " T=" + std::to_string(k.T) +
                 " V=" + std::to_string(k.V));
    auto dwte0 = randv(size_t(k.V) * k.C, f, 3, 0.01), dwpe0 = randv(size_t(k.T) * k.C, f, 4, 0.01);
    auto dout = randv(size_t(n) * k.C, f, 5, 0.1);
    Tensor dwte = host(dwte0, {k.V, k.C}), dwpe = host(dwpe0, {k.T, k.C});
    cpu_->encoder_backward(dwte, dwpe, host(dout, {k.B, k.T, k.C}), tok, f);
    auto g2 = two_schedules([&] {
      Buf a = dev(dwte0, f), b = dev(dwpe0, f), d = dev(dout, f), t(DType::I32, n);
      std::memcpy(t.p(), tk, size_t(n) * 4);
      Buf scratch(DType::I32, cudak::encoder_backward_scratch(n));
      cudak::encoder_backward(a.p(), b.p(), d.p(), static_cast<const int32_t*>(t.p()), k.B, k.T, k.C,
                              k.V, f, static_cast<int32_t*>(scratch.p()), nullptr);
      return std::vector<Buf>{a, b};
    });
    // The same sums in the same order as the CPU: exact.
    compare("encoder_backward dwte", g2[0], values(dwte), f, kExact);
    compare("encoder_backward dwpe", g2[1], values(dwpe), f, kExact);
  }
}

// ---------------------------------------------------------------- layernorm

TEST_P(SimtKernels, Layernorm) {
  const DType f = GetParam();
  // C <= 1024: the fused backward (one block per 64-row chunk, 32 rows a round, 16 for
  // C = 1000; N = 67, 5 and 70 end in part chunks, 136 in a part round); C = 1040: dinp and
  // the partials as two kernels.
  for (const auto& [N, C] : std::vector<std::pair<int, int>>{
           {67, 100}, {5, 768}, {136, 256}, {70, 1000}, {70, 1040}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    auto x = randv(static_cast<size_t>(N) * C, f, 10, 1.0, 0.3), w = randv(C, f, 11, 0.1, 1.0),
         b = randv(C, f, 12, 0.1);
    Tensor out = Tensor::empty({N, C}, DType::F32), mean = Tensor::empty({N}, DType::F32),
           rstd = Tensor::empty({N}, DType::F32);
    cpu_->layernorm_forward(out, mean, rstd, host(x, {N, C}), host(w, {C}), host(b, {C}), f);
    auto got = two_schedules([&] {
      Buf o(f, static_cast<size_t>(N) * C), m(DType::F32, N), r(DType::F32, N),
          xd = dev(x, f), wd = dev(w, f), bd = dev(b, f);
      cudak::layernorm_forward(o.p(), m.f(), r.f(), xd.p(), wd.p(), bd.p(), N, C, f, nullptr);
      return std::vector<Buf>{o, m, r};
    });
    // Row sums in another order (lane-strided + butterfly vs the CPU's loop): FP32
    // reassociation; out may round to the neighbouring bf16/fp16 value (1 ulp), the floor
    // absorbs x - mean cancelling; rstd: ~sqrt(C) 2^-24 relative (32 FP32 ulps).
    compare("layernorm_forward out", got[0], values(out), f,
            Tol{false, f == DType::F32 ? 8.0 : 1.0, 4e-6});
    compare("layernorm_forward mean", got[1], values(mean), DType::F32, Tol{false, 8, 1e-5});
    compare("layernorm_forward rstd", got[2], values(rstd), DType::F32, Tol{false, 32, 0});

    auto dout = randv(static_cast<size_t>(N) * C, f, 13, 0.1),
         dx0 = randv(static_cast<size_t>(N) * C, f, 14, 0.1), dw0 = randv(C, f, 15, 0.1),
         db0 = randv(C, f, 16, 0.1);
    Tensor dx = host(dx0, {N, C}), dw = host(dw0, {C}), db = host(db0, {C});
    cpu_->layernorm_backward(dx, dw, db, host(dout, {N, C}), host(x, {N, C}), host(w, {C}), mean,
                             rstd, f);
    auto g2 = two_schedules([&] {
      Buf a = dev(dx0, f), bw = dev(dw0, f), bb = dev(db0, f), d = dev(dout, f), xd = dev(x, f),
          wd = dev(w, f), m = dev(values(mean), DType::F32), r = dev(values(rstd), DType::F32);
      Buf scratch(DType::F32, cudak::layernorm_backward_scratch(N, C));
      cudak::layernorm_backward(a.p(), bw.p(), bb.p(), nullptr, d.p(), xd.p(), wd.p(), m.f(),
                                r.f(), N, C, f, scratch.f(), nullptr);
      return std::vector<Buf>{a, bw, bb};
    });
    // With dnext: the same dinp/dweight/dbias bits, and dnext the bits of colsum_accumulate
    // over the dinp it left (the next projection's bias gradient, made in the same pass).
    auto dn0 = randv(C, f, 17, 0.1);
    auto g3 = two_schedules([&] {
      Buf a = dev(dx0, f), bw = dev(dw0, f), bb = dev(db0, f), bn = dev(dn0, f), d = dev(dout, f),
          xd = dev(x, f), wd = dev(w, f), m = dev(values(mean), DType::F32),
          r = dev(values(rstd), DType::F32), bn2 = dev(dn0, f);
      Buf scratch(DType::F32, cudak::layernorm_backward_scratch(N, C));
      cudak::layernorm_backward(a.p(), bw.p(), bb.p(), bn.p(), d.p(), xd.p(), wd.p(), m.f(), r.f(),
                                N, C, f, scratch.f(), nullptr);
      Buf cs(DType::F32, cudak::colsum_scratch(N, C));
      cudak::colsum_accumulate(bn2.p(), a.p(), N, C, f, cs.f(), nullptr);
      return std::vector<Buf>{a, bw, bb, bn, bn2};
    });
    EXPECT_TRUE(same_bytes(g3[0], g2[0])) << "dinp changed with dnext";
    EXPECT_TRUE(same_bytes(g3[1], g2[1])) << "dweight changed with dnext";
    EXPECT_TRUE(same_bytes(g3[2], g2[2])) << "dbias changed with dnext";
    EXPECT_TRUE(same_bytes(g3[3], g3[4])) << "dnext differs from colsum_accumulate of dinp";
    // dinp: the row sums reassociated and cancelling (floor 2e-6 of the largest gradient);
    // dweight/dbias: column sums in chunks of 64 rows (the CPU's order when N <= 64).
    const double u = f == DType::F32 ? 16.0 : 1.0;
    compare("layernorm_backward dinp", g2[0], values(dx), f, Tol{false, u, 2e-6});
    compare("layernorm_backward dweight", g2[1], values(dw), f, Tol{false, u, 1e-5});
    compare("layernorm_backward dbias", g2[2], values(db), f, Tol{false, u, 1e-5});
    // ... and exactly the documented order, rebuilt here: per column, each chunk's rows in
    // row order from 0, the chunk sums in chunk order from 0, one rounding when added.
    const std::vector<float> m = values(mean), r = values(rstd);
    std::vector<float> want_dw(C), want_db(C);
    for (int c = 0; c < C; ++c) {
      float tw = 0.0f, tb = 0.0f;
      for (int r0 = 0; r0 < N; r0 += cudak::kColChunk) {
        float sw = 0.0f, sb = 0.0f;
        for (int row = r0; row < std::min(N, r0 + cudak::kColChunk); ++row) {
          const float d = dout[static_cast<size_t>(row) * C + c];
          const float n = (x[static_cast<size_t>(row) * C + c] - m[row]) * r[row];
          sb += d;
          const float p = d * n;
          sw += p;
        }
        tw += sw;
        tb += sb;
      }
      want_dw[c] = round_to(f, dw0[c] + tw);
      want_db[c] = round_to(f, db0[c] + tb);
    }
    compare("layernorm_backward dweight (chunk order)", g2[1], want_dw, f, kExact);
    compare("layernorm_backward dbias (chunk order)", g2[2], want_db, f, kExact);
  }
}

// The residual add fused into the layernorm forward: against the CPU backend's pair (the
// Backend default: residual_forward then layernorm_forward; same tolerances as above) and,
// bit for bit, against the emulated unfused pair, also in place (res = a).
TEST_P(SimtKernels, ResidualLayernormForwardIsThePairFused) {
  const DType f = GetParam();
  for (const auto& [N, C] : std::vector<std::pair<int, int>>{{67, 100}, {5, 768}, {9, 64}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    const size_t n = static_cast<size_t>(N) * C;
    auto a = randv(n, f, 30, 1.0, 0.3), b = randv(n, f, 31, 0.5), w = randv(C, f, 32, 0.1, 1.0),
         bi = randv(C, f, 33, 0.1);
    Tensor res = Tensor::empty({N, C}, DType::F32), out = Tensor::empty({N, C}, DType::F32),
           mean = Tensor::empty({N}, DType::F32), rstd = Tensor::empty({N}, DType::F32);
    cpu_->residual_layernorm_forward(res, out, mean, rstd, host(a, {N, C}), host(b, {N, C}),
                                     host(w, {C}), host(bi, {C}), f);
    auto fused = two_schedules([&] {
      Buf r(f, n), o(f, n), m(DType::F32, N), s(DType::F32, N), ad = dev(a, f), bd = dev(b, f),
          wd = dev(w, f), bid = dev(bi, f);
      cudak::residual_layernorm_forward(r.p(), o.p(), m.f(), s.f(), ad.p(), bd.p(), wd.p(), bid.p(),
                                        N, C, f, nullptr);
      return std::vector<Buf>{r, o, m, s};
    });
    auto pair = two_schedules([&] {
      Buf r(f, n), o(f, n), m(DType::F32, N), s(DType::F32, N), ad = dev(a, f), bd = dev(b, f),
          wd = dev(w, f), bid = dev(bi, f);
      cudak::residual_forward(r.p(), ad.p(), bd.p(), n, f, nullptr);
      cudak::layernorm_forward(o.p(), m.f(), s.f(), r.p(), wd.p(), bid.p(), N, C, f, nullptr);
      return std::vector<Buf>{r, o, m, s};
    });
    // In place, res = a (the backend allows res to alias a or b element for element).
    auto in_place = two_schedules([&] {
      Buf o(f, n), m(DType::F32, N), s(DType::F32, N), ad = dev(a, f), bd = dev(b, f),
          wd = dev(w, f), bid = dev(bi, f);
      cudak::residual_layernorm_forward(ad.p(), o.p(), m.f(), s.f(), ad.p(), bd.p(), wd.p(),
                                        bid.p(), N, C, f, nullptr);
      return std::vector<Buf>{ad, o, m, s};
    });
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(same_bytes(fused[i], pair[i])) << "output " << i << " differs from the pair";
      EXPECT_TRUE(same_bytes(in_place[i], pair[i])) << "in place: output " << i << " differs";
    }
    compare("residual_layernorm res", fused[0], values(res), f, kExact);
    compare("residual_layernorm out", fused[1], values(out), f,
            Tol{false, f == DType::F32 ? 8.0 : 1.0, 4e-6});
    compare("residual_layernorm mean", fused[2], values(mean), DType::F32, Tol{false, 8, 1e-5});
    compare("residual_layernorm rstd", fused[3], values(rstd), DType::F32, Tol{false, 32, 0});
  }
}

// ---------------------------------------------------------------- elementwise

TEST_P(SimtKernels, Elementwise) {
  const DType f = GetParam();
  for (size_t n : {size_t{1001}, size_t{4096}}) {  // odd: scalar path; 4096: 128-bit path
    auto x = randv(n, f, 20, 2.0), y = randv(n, f, 21), d = randv(n, f, 22);
    Tensor go = Tensor::empty({static_cast<int64_t>(n)}, DType::F32);
    Tensor gb = Tensor::empty({static_cast<int64_t>(n)}, DType::F32);
    Tensor ro = Tensor::empty({static_cast<int64_t>(n)}, DType::F32);
    const Shape s{static_cast<int64_t>(n)};
    cpu_->gelu_forward(go, host(x, s), f);
    cpu_->gelu_backward(gb, host(x, s), host(d, s), f);
    cpu_->residual_forward(ro, host(x, s), host(y, s), f);
    auto got = two_schedules([&] {
      Buf a(f, n), b(f, n), c(f, n), xd = dev(x, f), yd = dev(y, f), dd = dev(d, f);
      cudak::gelu_forward(a.p(), xd.p(), n, f, nullptr);
      cudak::gelu_backward(b.p(), xd.p(), dd.p(), n, f, nullptr);
      cudak::residual_forward(c.p(), xd.p(), yd.p(), n, f, nullptr);
      cudak::gelu_backward(dd.p(), xd.p(), dd.p(), n, f, nullptr);  // in place (dinp = dout)
      return std::vector<Buf>{a, b, c, dd};
    });
    // GELU: the CPU's formula operation for operation, but the kernel's tanhf (the host's
    // glibc tanhf under the emulator, <= 2.1 ulp; CUDA's on a GPU, <= 2 ulp) and the CPU's
    // (layers/vec_math.h, <= 0.501 ulp) differ in the last FP32 bits, which can move a
    // bf16/fp16 rounding by 1 ulp; the floors cover 1 + tanh(u) (forward) and 1 - tanh^2
    // (backward) cancelling. The same tolerances as the gpu tests (test_gpu_kernels.cpp).
    const Tol gelu_f{false, f == DType::F32 ? 8.0 : 1.0, 1e-6};
    const Tol gelu_b{false, f == DType::F32 ? 16.0 : 1.0, 4e-6};
    compare("gelu_forward", got[0], values(go), f, gelu_f);
    compare("gelu_backward", got[1], values(gb), f, gelu_b);
    compare("gelu_backward in place", got[3], values(gb), f, gelu_b);
    compare("residual_forward (one add, one rounding)", got[2], values(ro), f, kExact);
  }
  if (f != DType::F32) {  // round_inplace: FP32 storage rounded to fmt, as core/dtype.h
    auto x = randv(999, DType::F32, 23, 3.0);
    x[0] = 65520.0f, x[1] = 1e-40f, x[2] = NAN,
    x[3] = 0x1.0101p0f;  // overflow, subnormal, NaN, tie
    auto got = two_schedules([&] {
      Buf a = dev(x, DType::F32);
      cudak::round_inplace(a.f(), x.size(), f, nullptr);
      return std::vector<Buf>{a};
    });
    std::vector<float> want(x);
    round_inplace(f, want.data(), want.size());
    compare("round_inplace", got[0], want, DType::F32, kExact);
  }
}

// ---------------------------------------------------------------- conversions

TEST(SimtConvert, F32ToAndFrom16BitMatchesCoreDtype) {
  // Every bf16/fp16 pattern back to FP32, and FP32 patterns around every 16-bit rounding
  // boundary (ties, sticky bits, overflow, subnormals, NaN) to 16 bits: core/dtype.h (the CPU)
  // and the kernels under the emulator's independent __float2bfloat16_rn/__float2half_rn.
  std::vector<float> x;
  for (uint32_t hi = 0; hi < 65536; hi += 3) {
    for (uint32_t lo : {0x0000u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0xe000u}) {
      uint32_t u = (hi << 16) | lo;
      float v;
      std::memcpy(&v, &u, 4);
      x.push_back(v);
    }
  }
  for (DType h : {DType::BF16, DType::F16}) {
    const size_t n = x.size();
    std::vector<uint16_t> want(n), back_want(65536);
    if (h == DType::BF16)
      convert_f32_to_bf16(x.data(), want.data(), n);
    else
      convert_f32_to_fp16(x.data(), want.data(), n);
    std::vector<uint16_t> all(65536);
    std::iota(all.begin(), all.end(), 0);
    std::vector<float> back(65536);
    if (h == DType::BF16)
      convert_bf16_to_f32(all.data(), back.data(), 65536);
    else
      convert_fp16_to_f32(all.data(), back.data(), 65536);
    std::vector<uint16_t> got(n);
    std::vector<float> gback(65536);
    cuda_convert(got.data(), h, x.data(), DType::F32, n, nullptr);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << simt::last_failure();
    cuda_convert(gback.data(), DType::F32, all.data(), h, 65536, nullptr);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << simt::last_failure();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += got[i] != want[i];
    EXPECT_EQ(bad, 0u) << dtype_name(h) << ": fp32 -> 16-bit patterns differing";
    EXPECT_EQ(std::memcmp(gback.data(), back.data(), 65536 * 4), 0) << dtype_name(h) << " -> fp32";
  }
}

// ---------------------------------------------------------------- classifier

TEST_P(SimtKernels, Crossentropy) {
  const DType f = GetParam();
  const int N = 7, V = 997, Vp = 1001;
  const float dloss = (f == DType::F16 ? 1024.0f : 1.0f) / N;
  auto logits = randv(static_cast<size_t>(N) * Vp, f, 30, 2.0);
  Tensor tg = Tensor::empty({N}, DType::I32);
  int32_t* t = static_cast<int32_t*>(tg.raw());
  for (int i = 0; i < N; ++i) t[i] = (i * 131) % V;
  Tensor losses = Tensor::empty({N}, DType::F32), dl = Tensor::empty({N, Vp}, DType::F32);
  cpu_->crossentropy_forward_backward(losses, dl, host(logits, {N, Vp}), tg, V, dloss, f);
  auto got = two_schedules([&] {
    Buf l(DType::F32, N), d(f, static_cast<size_t>(N) * Vp), x = dev(logits, f), l2(DType::F32, N);
    cudak::crossentropy(l.f(), d.p(), x.p(), t, N, V, Vp, dloss, f, nullptr);
    cudak::crossentropy(l2.f(), x.p(), x.p(), t, N, V, Vp, dloss, f, nullptr);  // in place
    return std::vector<Buf>{l, d, x, l2};
  });
  // The softmax sum in a block tree vs the CPU's sequential loop: losses 16 FP32 ulps plus
  // 4e-6 of the largest; dlogits 1 bf16/fp16 ulp (16 in FP32) plus 1e-6 of the largest.
  compare("crossentropy losses", got[0], values(losses), DType::F32, Tol{false, 16, 4e-6});
  compare("crossentropy dlogits", got[1], values(dl), f,
          Tol{false, f == DType::F32 ? 16.0 : 1.0, 1e-6});
  compare("crossentropy dlogits in place", got[2], values(dl), f,
          Tol{false, f == DType::F32 ? 16.0 : 1.0, 1e-6});
  EXPECT_TRUE(same_bytes(got[3], got[0])) << "in-place losses differ";
}

// GELU backward with the fc bias gradient in one pass: bit for bit the emulated pair
// (gelu_backward, then colsum_accumulate of its output), out of place and in place; against
// the CPU backend's pair within the GELU tolerances above (dbias: the column sums of those).
TEST_P(SimtKernels, GeluBackwardDbiasIsThePairFused) {
  const DType f = GetParam();
  // OC = 300: the scalar path in 16-bit formats; 304: 16-byte vectors; N = 131: two whole
  // chunks and a part one that ends in a part batch of rows.
  for (const auto& [N, OC] : std::vector<std::pair<int, int>>{{131, 300}, {131, 304}, {7, 16}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " OC=" + std::to_string(OC));
    const size_t n = static_cast<size_t>(N) * OC;
    auto x = randv(n, f, 50, 2.0), d = randv(n, f, 51), db0 = randv(OC, f, 52, 0.1);
    const Shape s{N, OC};
    Tensor gb = Tensor::empty(s, DType::F32), db = host(db0, {OC});
    cpu_->gelu_backward_dbias(gb, db, host(x, s), host(d, s), f);
    auto fused = two_schedules([&] {
      Buf g(f, n), b = dev(db0, f), xd = dev(x, f), dd = dev(d, f), b2 = dev(db0, f),
          dd2 = dev(d, f), scr(DType::F32, cudak::colsum_scratch(N, OC));
      cudak::gelu_backward_dbias(g.p(), b.p(), xd.p(), dd.p(), N, OC, f, scr.f(), nullptr);
      cudak::gelu_backward_dbias(dd2.p(), b2.p(), xd.p(), dd2.p(), N, OC, f, scr.f(), nullptr);
      return std::vector<Buf>{g, b, dd2, b2};
    });
    auto pair = two_schedules([&] {
      Buf g(f, n), b = dev(db0, f), xd = dev(x, f), dd = dev(d, f),
          scr(DType::F32, cudak::colsum_scratch(N, OC));
      cudak::gelu_backward(g.p(), xd.p(), dd.p(), n, f, nullptr);
      cudak::colsum_accumulate(b.p(), g.p(), N, OC, f, scr.f(), nullptr);
      return std::vector<Buf>{g, b};
    });
    EXPECT_TRUE(same_bytes(fused[0], pair[0])) << "dinp differs from gelu_backward's";
    EXPECT_TRUE(same_bytes(fused[1], pair[1])) << "dbias differs from colsum_accumulate's";
    EXPECT_TRUE(same_bytes(fused[2], pair[0])) << "in place: dinp differs";
    EXPECT_TRUE(same_bytes(fused[3], pair[1])) << "in place: dbias differs";
    compare("gelu_backward_dbias dinp", fused[0], values(gb), f,
            Tol{false, f == DType::F32 ? 16.0 : 1.0, 4e-6});
    // dbias: sums of N values that may each differ by the GELU tolerance, chunked (N > 64)
    compare("gelu_backward_dbias dbias", fused[1], values(db), f,
            Tol{false, f == DType::F32 ? 64.0 : 1.0, 1e-5});
  }
}

// ---------------------------------------------------------------- reductions

TEST_P(SimtKernels, Reductions) {
  const DType f = GetParam();
  // column sums (dbias): N <= 64 is exactly the CPU's row order; N = 200: chunks of 64, each
  // in row order, the chunk sums in chunk order (rebuilt here: exact). OC = 300: the scalar
  // path for 16-bit formats; 304: 16-byte vectors for every format; N = 2100: 33 chunks, more
  // than one batch of the second pass (chunk_sum loads 32 chunks at a time).
  for (const auto& [N, OC] :
       std::vector<std::pair<int, int>>{{37, 300}, {200, 300}, {200, 304}, {2100, 40}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " OC=" + std::to_string(OC));
    auto dout = randv(static_cast<size_t>(N) * OC, f, 40, 0.1), db0 = randv(OC, f, 41, 0.1);
    std::vector<float> want(OC), want_rows(OC);
    for (int j = 0; j < OC; ++j) {
      float s = 0, total = 0;
      for (int i = 0; i < N; ++i) s += dout[static_cast<size_t>(i) * OC + j];
      want_rows[j] = round_to(f, db0[j] + s);
      for (int i0 = 0; i0 < N; i0 += cudak::kColChunk) {
        float c = 0;
        for (int i = i0; i < std::min(N, i0 + cudak::kColChunk); ++i)
          c += dout[static_cast<size_t>(i) * OC + j];
        total += c;
      }
      want[j] = round_to(f, db0[j] + total);
    }
    auto got = two_schedules([&] {
      Buf db = dev(db0, f), d = dev(dout, f), scratch(DType::F32, cudak::colsum_scratch(N, OC));
      cudak::colsum_accumulate(db.p(), d.p(), N, OC, f, scratch.f(), nullptr);
      return std::vector<Buf>{db};
    });
    compare("colsum (chunk order: exact)", got[0], want, f, kExact);
    compare(N <= cudak::kColChunk ? "colsum (row order: exact)" : "colsum vs row order", got[0],
            want_rows, f,
            N <= cudak::kColChunk ? kExact : Tol{false, f == DType::F32 ? 16.0 : 1.0, 1e-5});
  }
  // sum of squares: FP64, chunks of 64K as the CPU, another order inside: relative 2 n 2^-53
  const size_t n = (size_t{1} << 17) + 12345;
  auto x = randv(n, f, 42);
  const double want = cpu_->sum_squares(host(x, {static_cast<int64_t>(n)}));
  double got = 0;
  two_schedules([&] {
    Buf xd = dev(x, f), res(DType::F64, 1), scratch(DType::F64, cudak::sum_squares_scratch(n));
    cudak::sum_squares(reinterpret_cast<double*>(res.p()), xd.p(), n, f,
                       reinterpret_cast<double*>(scratch.p()), nullptr);
    std::memcpy(&got, res.p(), 8);
    return std::vector<Buf>{res};
  });
  EXPECT_NEAR(got, want, want * 2.0 * static_cast<double>(n) * 0x1p-53);
  // non-finite flag
  for (int plant : {-1, 0, 777}) {
    std::vector<float> y = randv(1000, f, 43);
    if (plant >= 0) y[plant] = plant == 0 ? INFINITY : NAN;
    const bool finite = cpu_->all_finite(host(y, {1000}));
    Buf yd = dev(y, f), flag(DType::I32, 1);
    std::memset(flag.p(), 0, 4);
    cudak::any_nonfinite(reinterpret_cast<int*>(flag.p()), yd.p(), y.size(), f, nullptr);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << simt::last_failure();
    int fl;
    std::memcpy(&fl, flag.p(), 4);
    EXPECT_EQ(fl != 0, !finite) << "planted at " << plant;
  }
}

// ---------------------------------------------------------------- AdamW

// AdamW's inputs: FP32 master, m and v >= 0, a gradient in f (seeds seed .. seed + 3).
struct AdamWInputs {
  std::vector<float> master, grad, m, v;
};
AdamWInputs adamw_inputs(size_t n, DType f, uint64_t seed) {
  AdamWInputs in{randv(n, DType::F32, seed, 0.1), randv(n, f, seed + 1, 0.01),
                 randv(n, DType::F32, seed + 2, 0.001), randv(n, DType::F32, seed + 3, 0.001)};
  for (auto& x : in.v) x = x * x;
  return in;
}

TEST_P(SimtKernels, AdamW) {
  const DType f = GetParam();
  const size_t n = 1003;
  const AdamWInputs in = adamw_inputs(n, f, 50);
  const std::vector<float>&master0 = in.master, &grad = in.grad, &m0 = in.m, &v0 = in.v;
  AdamWArgs a;
  a.lr = 1e-3f, a.weight_decay = 0.1f, a.step = 7, a.grad_scale = 0.5f;
  const Shape s{static_cast<int64_t>(n)};
  Tensor master = host(master0, s), m = host(m0, s), v = host(v0, s),
         param = Tensor::empty(s, DType::F32);
  cpu_->adamw_update(master, param, host(grad, s), m, v, a, f);
  const auto sc =
      cudak::adamw_scalars(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step, a.grad_scale);
  auto got = two_schedules([&] {
    Buf md = dev(master0, DType::F32), p(f, n), g = dev(grad, f), mm = dev(m0, DType::F32),
        vv = dev(v0, DType::F32);
    cudak::adamw(md.f(), p.p(), g.p(), mm.f(), vv.f(), n, sc, f, false, 0, 0, 0, nullptr);
    return std::vector<Buf>{md, p, mm, vv};
  });
  // The CPU's operations in the CPU's order with the scalars computed as the CPU does: exact.
  compare("adamw master", got[0], values(master), DType::F32, kExact);
  compare("adamw param", got[1], values(param), f, kExact);
  compare("adamw m", got[2], values(m), DType::F32, kExact);
  compare("adamw v", got[3], values(v), DType::F32, kExact);
}

// The 4-wide path (aligned pointers) and the one-element path (the same arrays one element
// in, so no pointer is 16-byte aligned) give the same bits element for element, with
// round-to-nearest and with stochastic rounding (whose random bits come from the element's
// flat index: index0 + i).
TEST_P(SimtKernels, AdamWVectorAndScalarPathsAgree) {
  const DType f = GetParam();
  const size_t n = 1003;
  const AdamWInputs in = adamw_inputs(n, f, 54);
  const std::vector<float>&master0 = in.master, &grad = in.grad, &m0 = in.m, &v0 = in.v;
  const auto sc = cudak::adamw_scalars(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f);
  for (bool stochastic : {false, true}) {
    SCOPED_TRACE(stochastic ? "stochastic rounding" : "round to nearest");
    auto run = [&](size_t off) {
      return two_schedules([&] {
        Buf md = dev(master0, DType::F32), p(f, n), g = dev(grad, f), mm = dev(m0, DType::F32),
            vv = dev(v0, DType::F32);
        cudak::adamw(md.f() + off, static_cast<unsigned char*>(p.p()) + off * dtype_size(f),
                     static_cast<const unsigned char*>(g.p()) + off * dtype_size(f),
                     mm.f() + off, vv.f() + off, n - off, sc, f, stochastic, 1234, 7, off,
                     nullptr);
        return std::vector<Buf>{md, p, mm, vv};
      });
    };
    const auto wide = run(0), narrow = run(1);
    for (int k = 0; k < 4; ++k) {
      const size_t es = dtype_size(wide[k].dtype);
      EXPECT_EQ(0, std::memcmp(static_cast<unsigned char*>(wide[k].p()) + es,
                               static_cast<unsigned char*>(narrow[k].p()) + es, (n - 1) * es))
          << "output " << k << " differs between the 4-wide and the one-element path";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, SimtKernels, ::testing::ValuesIn(kFmts),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace st
