// bench_gpu: speed of the CUDA backend's first kernels on this GPU.
//  - the cuBLASLt BF16 GEMM (CudaBackend::matmul_forward) on GPT-2 124M shapes with
//    N = B*T = 8192 tokens, in TFLOP/s, against cublasGemmEx on the same shape with the
//    same numerics (FP32 compute, no reduced-precision split-K);
//  - the format-conversion kernels in GB/s against cudaMemcpy device-to-device bandwidth
//    measured in the same run.
// Timing: CUDA events on the backend's stream, warm-up runs, median of the timed runs.
// Prints one markdown table: kernel | measured | comparison | ratio.
//
// `bench_gpu kernels` instead times every Backend method of the CUDA backend on GPT-2 124M
// shapes (B=8, T=1024, C=768, vocabulary 50257 padded to 50304, 124.5M parameters, bf16):
// memory-bound kernels in GB/s (the fewest bytes the method must move: each input read
// once, each output written once) against the device-to-device cudaMemcpy bandwidth, GEMMs
// in TFLOP/s against cublasGemmEx's BF16 rate on 8192^3 (FP32 compute, cuBLAS's default
// algorithm), both ceilings measured in the same run on random data. Table: kernel | shape
// | time | achieved | ceiling | ratio.
//   usage: bench_gpu [kernels] [reps]   (default 20)
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/rng.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "model/gpt2.h"

namespace st {
namespace {

struct Timer {
  cudaStream_t stream;
  int warmup = 3, reps = 20;
  template <class F>
  double median_ms(F&& f) const {
    cudaEvent_t a, b;
    ST_CUDA_CHECK(cudaEventCreate(&a));
    ST_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < warmup; ++i) f();
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; ++i) {
      ST_CUDA_CHECK(cudaEventRecord(a, stream));
      f();
      ST_CUDA_CHECK(cudaEventRecord(b, stream));
      ST_CUDA_CHECK(cudaEventSynchronize(b));
      ST_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    ST_CUDA_CHECK(cudaEventDestroy(a));
    ST_CUDA_CHECK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
  }
};

struct Row {
  std::string kernel, measured, comparison;
  double ratio;
};

std::string fmt(const char* f, double v, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return std::string(buf) + unit;
}

// Device tensor of `shape` in storage `dtype`, filled with normal * scale (rounded on copy).
Tensor random_device(CudaBackend& be, const Shape& shape, DType dtype, double scale, Rng& rng) {
  Tensor h = Tensor::empty(shape, DType::F32);
  float* p = h.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) p[i] = static_cast<float>(rng.normal() * scale);
  Tensor d = be.alloc(shape, dtype);
  be.copy(d, h);
  return d;
}

struct GemmShape {
  const char* name;
  int64_t C, OC;
  bool bias;
};

void bench_gemms(CudaBackend& be, const Timer& timer, std::vector<Row>& rows) {
  const int64_t N = 8192;  // B*T tokens
  const int64_t C = 768;
  const GemmShape shapes[] = {{"qkv      C->3C", C, 3 * C, true},
                              {"attn out C->C", C, C, true},
                              {"fc       C->4C", C, 4 * C, true},
                              {"fc proj 4C->C", 4 * C, C, true},
                              {"lm head  C->50304", C, 50304, false}};
  cublasHandle_t handle;
  ST_CUDA_CHECK(cublasCreate(&handle));
  ST_CUDA_CHECK(cublasSetStream(handle, be.stream()));
  // Same numerics as ours: no split-K reductions in BF16.
  ST_CUDA_CHECK(cublasSetMathMode(
      handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                        CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  Rng rng(1);
  for (const GemmShape& s : shapes) {
    Tensor inp = random_device(be, {N, s.C}, DType::BF16, 1.0, rng);
    Tensor w = random_device(be, {s.OC, s.C}, DType::BF16, 0.02, rng);
    Tensor b = s.bias ? random_device(be, {s.OC}, DType::BF16, 0.1, rng) : Tensor();
    Tensor out = be.alloc({N, s.OC}, DType::BF16);
    const double flop = 2.0 * N * s.C * s.OC;
    const double ours = timer.median_ms([&] { be.matmul_forward(out, inp, w, b, DType::BF16); });
    const float alpha = 1.0f, beta = 0.0f;
    const double ref = timer.median_ms([&] {
      ST_CUDA_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.OC),
                                 static_cast<int>(N), static_cast<int>(s.C), &alpha, w.raw(),
                                 CUDA_R_16BF, static_cast<int>(s.C), inp.raw(), CUDA_R_16BF,
                                 static_cast<int>(s.C), &beta, out.raw(), CUDA_R_16BF,
                                 static_cast<int>(s.OC), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    const double t_ours = flop / (ours * 1e-3) / 1e12, t_ref = flop / (ref * 1e-3) / 1e12;
    rows.push_back({std::string("gemm bf16 ") + s.name + (s.bias ? " +bias" : ""),
                    fmt("%.1f", t_ours, " TFLOP/s"), fmt("%.1f", t_ref, " TFLOP/s cublasGemmEx"),
                    t_ours / t_ref});
  }
  ST_CUDA_CHECK(cublasDestroy(handle));
}

void bench_conversions(CudaBackend& be, const Timer& timer, std::vector<Row>& rows) {
  const int64_t n = int64_t{1} << 26;  // 64 Mi elements: 256 MiB of fp32
  Tensor f32 = be.alloc({n}, DType::F32), f32b = be.alloc({n}, DType::F32);
  Tensor h16 = be.alloc({n}, DType::BF16);
  be.zero(f32);
  be.zero(h16);
  const double copy_ms = timer.median_ms([&] {
    ST_CUDA_CHECK(cudaMemcpyAsync(f32b.raw(), f32.raw(), f32.nbytes(), cudaMemcpyDeviceToDevice,
                                  be.stream()));
  });
  const double copy_gbs = 2.0 * f32.nbytes() / (copy_ms * 1e-3) / 1e9;  // read + write
  rows.push_back(
      {"cudaMemcpy D2D fp32 64Mi", fmt("%.0f", copy_gbs, " GB/s"), "(the reference)", 1.0});
  struct Conv {
    const char* name;
    DType dst, src;
  };
  const Conv convs[] = {{"convert fp32->bf16 64Mi", DType::BF16, DType::F32},
                        {"convert bf16->fp32 64Mi", DType::F32, DType::BF16},
                        {"convert fp32->fp16 64Mi", DType::F16, DType::F32},
                        {"convert fp16->fp32 64Mi", DType::F32, DType::F16}};
  for (const Conv& c : convs) {
    void* dst = c.dst == DType::F32 ? f32.raw() : h16.raw();
    const void* src = c.src == DType::F32 ? f32.raw() : h16.raw();
    const double ms =
        timer.median_ms([&] { cuda_convert(dst, c.dst, src, c.src, n, be.stream()); });
    const double gbs = static_cast<double>(n) * 6 / (ms * 1e-3) / 1e9;  // 4 + 2 bytes each
    rows.push_back({c.name, fmt("%.0f", gbs, " GB/s"), fmt("%.0f", copy_gbs, " GB/s memcpy D2D"),
                    gbs / copy_gbs});
  }
}

// ---------------------------------------------------------------- bench_gpu kernels

// Uniform values in [shift - scale, shift + scale), from a hash of the index: random data
// (never all zeros), made on the device so that gigabytes need no host work.
template <class T>
__global__ void fill_kernel(T* p, size_t n, uint64_t seed, float scale, float shift) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * 5.9604644775390625e-8f * 2.0f - 1.0f;  // [-1, 1)
    p[i] = cudak::from_float<T>(shift + scale * u);
  }
}

void fill(CudaBackend& be, const Tensor& t, uint64_t seed, float scale, float shift = 0.0f) {
  const size_t n = static_cast<size_t>(t.numel());
  const unsigned grid = cudak::grid_for(n, 256);
  cudak::dispatch_storage(t.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_kernel<T><<<grid, 256, 0, be.stream()>>>(static_cast<T*>(t.raw()), n, seed, scale, shift);
  });
  ST_CUDA_CHECK_LAUNCH("fill_kernel");
}

Tensor random_tensor(CudaBackend& be, const Shape& s, DType d, uint64_t seed, float scale,
                     float shift = 0.0f) {
  Tensor t = be.alloc(s, d);
  fill(be, t, seed, scale, shift);
  return t;
}

struct KRow {
  std::string kernel, shape;
  double ms;
  double amount;  // bytes moved, or FLOPs for a GEMM
  bool gemm;
};

std::string shape_of(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

int run_kernels(const Timer& timer, CudaBackend& be) {
  const int64_t B = 8, T = 1024, N = B * T, C = 768, V = 50257, Vp = 50304;
  const DType bf = DType::BF16;
  const double b2 = 2.0;  // bytes per bf16 element
  uint64_t seed = 1;

  // Ceilings, measured first in this run.
  const int64_t ncopy = int64_t{1} << 28;  // 256 Mi bf16 elements: 512 MiB each way
  double copy_gbs = 0;
  {
    Tensor a = random_tensor(be, {ncopy}, bf, seed++, 1.0f), b = be.alloc({ncopy}, bf);
    const double ms = timer.median_ms([&] {
      ST_CUDA_CHECK(
          cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice, be.stream()));
    });
    copy_gbs = 2.0 * a.nbytes() / (ms * 1e-3) / 1e9;
  }
  double gemm_tflops = 0;
  {
    const int g = 8192;
    Tensor a = random_tensor(be, {g, g}, bf, seed++, 1.0f),
           b = random_tensor(be, {g, g}, bf, seed++, 1.0f);
    Tensor c = be.alloc({g, g}, bf);
    cublasHandle_t handle;
    ST_CUDA_CHECK(cublasCreate(&handle));
    ST_CUDA_CHECK(cublasSetStream(handle, be.stream()));
    const float alpha = 1.0f, beta = 0.0f;
    const double ms = timer.median_ms([&] {
      ST_CUDA_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, g, g, g, &alpha, a.raw(),
                                 CUDA_R_16BF, g, b.raw(), CUDA_R_16BF, g, &beta, c.raw(),
                                 CUDA_R_16BF, g, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    ST_CUDA_CHECK(cublasDestroy(handle));
    gemm_tflops = 2.0 * g * g * static_cast<double>(g) / (ms * 1e-3) / 1e12;
  }
  std::printf(
      "ceilings (this run): cudaMemcpy D2D %.0f GB/s (read + write, 512 MiB); "
      "cublasGemmEx bf16 8192^3 %.1f TFLOP/s\n\n",
      copy_gbs, gemm_tflops);

  std::vector<KRow> rows;
  auto time = [&](const std::string& k, const std::string& shape, double amount, bool gemm,
                  const std::function<void()>& f) {
    rows.push_back({k, shape, timer.median_ms(f), amount, gemm});
  };

  // Host tokens / targets, uniform over the vocabulary.
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  Rng rng(7);
  for (int64_t i = 0; i < N; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(rng.below(V));
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng.below(V));
  }
  const double NC = static_cast<double>(N) * C;
  {
    Tensor wte = random_tensor(be, {Vp, C}, bf, seed++, 0.1f),
           wpe = random_tensor(be, {T, C}, bf, seed++, 0.02f);
    Tensor out = be.alloc({B, T, C}, bf);
    time("encoder_forward", shape_of({B, T, C}), 2 * NC * b2 + T * C * b2, false,
         [&] { be.encoder_forward(out, tokens, wte, wpe, bf); });
    Tensor dwte = random_tensor(be, {Vp, C}, bf, seed++, 0.01f),
           dwpe = random_tensor(be, {T, C}, bf, seed++, 0.01f);
    std::vector<int32_t> tk(tokens.data<int32_t>(), tokens.data<int32_t>() + N);
    std::sort(tk.begin(), tk.end());
    const double distinct = static_cast<double>(std::unique(tk.begin(), tk.end()) - tk.begin());
    time("encoder_backward (device sort)", shape_of({B, T, C}),
         NC * b2 + 2 * distinct * C * b2 + 2 * T * C * b2, false,
         [&] { be.encoder_backward(dwte, dwpe, out, tokens, bf); });
  }
  {
    Tensor inp = random_tensor(be, {B, T, C}, bf, seed++, 1.0f, 0.3f),
           out = be.alloc({B, T, C}, bf);
    Tensor w = random_tensor(be, {C}, bf, seed++, 0.1f, 1.0f),
           bias = random_tensor(be, {C}, bf, seed++, 0.1f);
    Tensor mean = be.alloc({B, T}, DType::F32), rstd = be.alloc({B, T}, DType::F32);
    time("layernorm_forward", shape_of({N, C}), 2 * NC * b2 + 8.0 * N, false,
         [&] { be.layernorm_forward(out, mean, rstd, inp, w, bias, bf); });
    Tensor dinp = random_tensor(be, {B, T, C}, bf, seed++, 0.1f),
           dout = random_tensor(be, {B, T, C}, bf, seed++, 0.1f);
    Tensor dw = random_tensor(be, {C}, bf, seed++, 0.1f),
           db = random_tensor(be, {C}, bf, seed++, 0.1f);
    time("layernorm_backward", shape_of({N, C}), 4 * NC * b2 + 8.0 * N, false,
         [&] { be.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, bf); });
    Tensor r = be.alloc({B, T, C}, bf);
    time("residual_forward", shape_of({N, C}), 3 * NC * b2, false,
         [&] { be.residual_forward(r, inp, dinp, bf); });
    // the pair the model runs at every residual, as one kernel: read a, b; write res, out
    time("residual + layernorm_forward (fused)", shape_of({N, C}), 4 * NC * b2 + 8.0 * N, false,
         [&] { be.residual_layernorm_forward(r, out, mean, rstd, inp, dinp, w, bias, bf); });
  }
  {
    Tensor x = random_tensor(be, {N, 4 * C}, bf, seed++, 2.0f), y = be.alloc({N, 4 * C}, bf);
    Tensor d = random_tensor(be, {N, 4 * C}, bf, seed++, 1.0f);
    time("gelu_forward", shape_of({N, 4 * C}), 2 * 4 * NC * b2, false,
         [&] { be.gelu_forward(y, x, bf); });
    time("gelu_backward (in place)", shape_of({N, 4 * C}), 3 * 4 * NC * b2, false,
         [&] { be.gelu_backward(d, x, d, bf); });
    Tensor db = random_tensor(be, {4 * C}, bf, seed++, 0.01f);
    time("gelu_backward + dbias (in place)", shape_of({N, 4 * C}), 3 * 4 * NC * b2, false,
         [&] { be.gelu_backward_dbias(d, db, x, d, bf); });
  }
  struct Mm {
    const char* name;
    int64_t C, OC;
    bool bias;
  };
  for (const Mm& m : {Mm{"qkv C->3C", C, 3 * C, true}, Mm{"attn proj C->C", C, C, true},
                      Mm{"fc C->4C", C, 4 * C, true}, Mm{"fc proj 4C->C", 4 * C, C, true},
                      Mm{"lm head C->Vp", C, Vp, false}}) {
    Tensor inp = random_tensor(be, {N, m.C}, bf, seed++, 1.0f);
    Tensor w = random_tensor(be, {m.OC, m.C}, bf, seed++, 0.02f);
    Tensor bias = m.bias ? random_tensor(be, {m.OC}, bf, seed++, 0.1f) : Tensor();
    Tensor out = be.alloc({N, m.OC}, bf);
    const double flop = 2.0 * N * m.C * static_cast<double>(m.OC);
    time(std::string("matmul_forward ") + m.name + (m.bias ? " +bias" : ""),
         shape_of({N, m.C, m.OC}), flop, true, [&] { be.matmul_forward(out, inp, w, bias, bf); });
    Tensor dout = random_tensor(be, {N, m.OC}, bf, seed++, 0.01f), dinp = be.alloc({N, m.C}, bf);
    Tensor dw = random_tensor(be, {m.OC, m.C}, bf, seed++, 0.01f);
    Tensor db = m.bias ? random_tensor(be, {m.OC}, bf, seed++, 0.01f) : Tensor();
    time(std::string("matmul_backward ") + m.name + (m.bias ? " +dbias" : ""),
         shape_of({N, m.C, m.OC}), 2 * flop, true,
         [&] { be.matmul_backward(dinp, dw, db, dout, inp, w, bf); });
  }
  {
    Tensor logits = random_tensor(be, {B, T, Vp}, bf, seed++, 2.0f),
           losses = be.alloc({B, T}, DType::F32);
    const double L = static_cast<double>(N) * Vp * b2;
    time("crossentropy forward only", shape_of({N, Vp}), L + 4.0 * N, false, [&] {
      be.crossentropy_forward_backward(losses, Tensor(), logits, targets, static_cast<int>(V), 0.0f,
                                       bf);
    });
    time("crossentropy fwd+bwd (in place)", shape_of({N, Vp}), 2 * L + 4.0 * N, false, [&] {
      be.crossentropy_forward_backward(losses, logits, logits, targets, static_cast<int>(V),
                                       1.0f / N, bf);
    });
  }
  // B = 64 (bench train's step): the cost model's out-of-sample rows, by the same names
  // (tests/simt/cost/simt_cost_model.cpp), so that tools/cost_model_vs_measured.py joins them.
  {
    const int64_t B64 = 64, N64 = B64 * T;
    const double NC64 = static_cast<double>(N64) * C;
    Tensor tok64 = Tensor::empty({B64, T}, DType::I32), tgt64 = Tensor::empty({B64, T}, DType::I32);
    for (int64_t i = 0; i < N64; ++i) {
      tok64.data<int32_t>()[i] = static_cast<int32_t>(rng.below(V));
      tgt64.data<int32_t>()[i] = static_cast<int32_t>(rng.below(V));
    }
    {
      Tensor wte = random_tensor(be, {Vp, C}, bf, seed++, 0.01f),
             wpe = random_tensor(be, {T, C}, bf, seed++, 0.01f);
      Tensor out = random_tensor(be, {B64, T, C}, bf, seed++, 0.1f);
      time("encoder_forward (B=64)", shape_of({B64, T, C}), 2 * NC64 * b2 + T * C * b2, false,
           [&] { be.encoder_forward(out, tok64, wte, wpe, bf); });
      time("encoder_backward (device sort, B=64)", shape_of({B64, T, C}),
           NC64 * b2 + 2 * T * C * b2, false,
           [&] { be.encoder_backward(wte, wpe, out, tok64, bf); });
    }
    {
      Tensor a = random_tensor(be, {B64, T, C}, bf, seed++, 1.0f, 0.3f),
             b = random_tensor(be, {B64, T, C}, bf, seed++, 0.5f), r = be.alloc({B64, T, C}, bf),
             out = be.alloc({B64, T, C}, bf);
      Tensor w = random_tensor(be, {C}, bf, seed++, 0.1f, 1.0f),
             bias = random_tensor(be, {C}, bf, seed++, 0.1f);
      Tensor mean = be.alloc({B64, T}, DType::F32), rstd = be.alloc({B64, T}, DType::F32);
      time("residual_forward (B=64)", shape_of({N64, C}), 3 * NC64 * b2, false,
           [&] { be.residual_forward(r, a, b, bf); });
      time("layernorm_forward (B=64)", shape_of({N64, C}), 2 * NC64 * b2 + 8.0 * N64, false,
           [&] { be.layernorm_forward(out, mean, rstd, r, w, bias, bf); });
      time("residual + layernorm_forward (fused, B=64)", shape_of({N64, C}),
           4 * NC64 * b2 + 8.0 * N64, false,
           [&] { be.residual_layernorm_forward(r, out, mean, rstd, a, b, w, bias, bf); });
      Tensor dinp = random_tensor(be, {B64, T, C}, bf, seed++, 0.1f);
      Tensor dw = random_tensor(be, {C}, bf, seed++, 0.1f), db = random_tensor(be, {C}, bf, seed++, 0.1f);
      time("layernorm_backward (B=64)", shape_of({N64, C}), 4 * NC64 * b2 + 8.0 * N64, false,
           [&] { be.layernorm_backward(dinp, dw, db, b, r, w, mean, rstd, bf); });
      Tensor dn = random_tensor(be, {C}, bf, seed++, 0.1f);
      time("layernorm_backward + dbias (B=64)", shape_of({N64, C}), 4 * NC64 * b2 + 8.0 * N64,
           false, [&] { be.layernorm_backward_dbias(dinp, dw, db, dn, b, r, w, mean, rstd, bf); });
    }
    {  // the dbias column sums of the biased matmul backwards (Backend::bias_backward)
      Tensor d = random_tensor(be, {N64, 4 * C}, bf, seed++, 0.01f);
      for (int64_t oc : {3 * C, C, 4 * C}) {
        Tensor db = random_tensor(be, {oc}, bf, seed++, 0.01f);
        const Tensor dv = d.flat(0, N64 * oc, {N64, oc});
        time("colsum dbias (B=64, OC=" + std::to_string(oc) + ")", shape_of({N64, oc}),
             N64 * static_cast<double>(oc) * b2, false, [&] { be.bias_backward(db, dv, bf); });
      }
    }
    {
      Tensor x = random_tensor(be, {N64, 4 * C}, bf, seed++, 2.0f), y = be.alloc({N64, 4 * C}, bf);
      time("gelu_forward (B=64)", shape_of({N64, 4 * C}), 2 * 4 * NC64 * b2, false,
           [&] { be.gelu_forward(y, x, bf); });
      time("gelu_backward (in place, B=64)", shape_of({N64, 4 * C}), 3 * 4 * NC64 * b2, false,
           [&] { be.gelu_backward(y, x, y, bf); });
      Tensor db = random_tensor(be, {4 * C}, bf, seed++, 0.01f);
      time("gelu_backward + dbias (in place, B=64)", shape_of({N64, 4 * C}), 3 * 4 * NC64 * b2,
           false, [&] { be.gelu_backward_dbias(y, db, x, y, bf); });
    }
    {
      Tensor logits = random_tensor(be, {B64, T, Vp}, bf, seed++, 2.0f),
             losses = be.alloc({B64, T}, DType::F32);
      const double L = static_cast<double>(N64) * Vp * b2;
      time("crossentropy forward only (B=64)", shape_of({N64, Vp}), L + 4.0 * N64, false, [&] {
        be.crossentropy_forward_backward(losses, Tensor(), logits, tgt64, static_cast<int>(V),
                                         0.0f, bf);
      });
      time("crossentropy fwd+bwd (in place, B=64)", shape_of({N64, Vp}), 2 * L + 4.0 * N64, false,
           [&] {
             be.crossentropy_forward_backward(losses, logits, logits, tgt64, static_cast<int>(V),
                                              1.0f / N64, bf);
           });
    }
  }
  {
    GPT2Config cfg;
    cfg.n_layer = 12;
    cfg.n_head = 12;
    cfg.n_embd = static_cast<int>(C);
    cfg.vocab_size = static_cast<int>(V);
    cfg.max_seq_len = static_cast<int>(T);
    cfg.padded_vocab_size = static_cast<int>(Vp);
    const int64_t P = num_parameters(cfg);
    const double p = static_cast<double>(P);
    Tensor master = random_tensor(be, {P}, DType::F32, seed++, 0.05f);
    Tensor m = random_tensor(be, {P}, DType::F32, seed++, 1e-3f);
    Tensor v = random_tensor(be, {P}, DType::F32, seed++, 5e-6f, 5e-6f);  // positive
    Tensor grad = random_tensor(be, {P}, bf, seed++, 0.01f), param = be.alloc({P}, bf);
    const std::string ps = std::to_string(P);
    time("sum_squares (grad norm)", ps, p * b2, false, [&] { (void)be.sum_squares(grad); });
    time("all_finite", ps, p * b2, false, [&] { (void)be.all_finite(grad); });
    AdamWArgs a;
    a.lr = 1e-4f;
    a.weight_decay = 0.1f;
    a.step = 10;
    time("adamw_update", ps, p * (4 + 2 + 4 + 4 + 4 + 2 + 4 + 4), false,
         [&] { be.adamw_update(master, param, grad, m, v, a, bf); });
    time("round_copy fp32 -> bf16", ps, p * 6, false, [&] { be.round_copy(param, master, bf); });
    time("zero", ps, p * b2, false, [&] { be.zero(grad); });
    time("copy bf16 device to device", ps, 2 * p * b2, false, [&] { be.copy(param, grad); });
  }
  be.synchronize();

  std::printf("| %-40s | %-16s | %10s | %-16s | %-26s | %-6s |\n", "kernel (bf16)", "shape",
              "time (us)", "achieved", "ceiling (this run)", "ratio");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(42, '-').c_str(), std::string(18, '-').c_str(),
              std::string(12, '-').c_str(), std::string(18, '-').c_str(),
              std::string(28, '-').c_str(), std::string(8, '-').c_str());
  for (const KRow& r : rows) {
    const double rate = r.amount / (r.ms * 1e-3) / (r.gemm ? 1e12 : 1e9);
    const double ceil = r.gemm ? gemm_tflops : copy_gbs;
    std::printf(
        "| %-40s | %-16s | %10.1f | %-16s | %-26s | %6.2f |\n", r.kernel.c_str(), r.shape.c_str(),
        r.ms * 1e3, (r.gemm ? fmt("%.1f", rate, " TFLOP/s") : fmt("%.0f", rate, " GB/s")).c_str(),
        (r.gemm ? fmt("%.1f", ceil, " TFLOP/s cuBLAS bf16") : fmt("%.0f", ceil, " GB/s memcpy D2D"))
            .c_str(),
        rate / ceil);
  }
  const ArenaStats st = be.memory_stats();
  std::printf("\narena: %lld cudaMalloc calls, %.2f GiB reserved, peak %.2f GiB in use\n",
              static_cast<long long>(st.cuda_malloc_calls), st.reserved_bytes / 1073741824.0,
              st.peak_in_use_bytes / 1073741824.0);
  return 0;
}

int run(int argc, char** argv) {
  Timer timer{};
  bool kernels = false;
  int argi = 1;
  if (argc > argi && std::string(argv[argi]) == "kernels") {
    kernels = true;
    ++argi;
  }
  if (argc > argi) timer.reps = std::max(1, std::atoi(argv[argi]));
  std::unique_ptr<Backend> owner = make_cuda_backend(0);
  auto& be = dynamic_cast<CudaBackend&>(*owner);
  timer.stream = be.stream();
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, be.device_index()));
  int driver = 0, runtime = 0;
  ST_CUDA_CHECK(cudaDriverGetVersion(&driver));
  ST_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB), driver %d, runtime %d\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0,
              driver, runtime);
  std::printf("timing: CUDA events, %d warm-up + median of %d runs\n\n", timer.warmup, timer.reps);
  if (kernels) return run_kernels(timer, be);

  std::vector<Row> rows;
  bench_gemms(be, timer, rows);
  bench_conversions(be, timer, rows);
  be.synchronize();

  std::printf("| %-34s | %-16s | %-34s | %-6s |\n", "kernel", "measured", "comparison", "ratio");
  std::printf("|%s|%s|%s|%s|\n", std::string(36, '-').c_str(), std::string(18, '-').c_str(),
              std::string(36, '-').c_str(), std::string(8, '-').c_str());
  for (const Row& r : rows) {
    std::printf("| %-34s | %-16s | %-34s | %6.2f |\n", r.kernel.c_str(), r.measured.c_str(),
                r.comparison.c_str(), r.ratio);
  }
  return 0;
}

}  // namespace
}  // namespace st

int main(int argc, char** argv) {
  try {
    return st::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
}
