// bench_gpu: speed of the CUDA backend's first kernels on this GPU.
//  - the cuBLASLt BF16 GEMM (CudaBackend::matmul_forward) on GPT-2 124M shapes with
//    N = B*T = 8192 tokens, in TFLOP/s, against cublasGemmEx on the same shape with the
//    same numerics (FP32 compute, no reduced-precision split-K);
//  - the format-conversion kernels in GB/s against cudaMemcpy device-to-device bandwidth
//    measured in the same run.
// Timing: CUDA events on the backend's stream, warm-up runs, median of the timed runs.
// Prints one markdown table: kernel | measured | comparison | ratio.
//   usage: bench_gpu [reps]   (default 20)
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"

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

int run(int argc, char** argv) {
  Timer timer{};
  if (argc > 1) timer.reps = std::max(1, std::atoi(argv[1]));
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
