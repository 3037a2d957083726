// The inline PTX of the flash attention kernels, as small device functions: on the GPU each
// is the asm statement, under the SIMT emulator (ST_SIMT, tests/simt) the emulator's C++
// implementation of the same instruction, written from the PTX ISA's definitions. Kernel
// bodies call these and carry no #ifdef. Included by .cu files only.
//
//   ldmatrix_x1/x2/x4[_trans](r, addr)  ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16
//   mma_16816<T>(d, a, b0, b1)          mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32
//   cp_async_16 / cp_async_4            cp.async.{cg,ca}.shared.global with src-size (zero fill)
//   cp_async_commit, cp_async_wait<N>   cp.async.commit_group / wait_group N
//   ex2_approx(x)                       ex2.approx.ftz.f32
//   smem_addr(p)                        the shared-space address of a shared pointer
// Fragment layouts: cuda/flash_common.cuh (top) and tests/simt/README.md.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(ST_SIMT)
#include "simt/simt.h"
#endif

namespace st::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(ST_SIMT)

__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], uint32_t addr) {
  uint32_t t[4];
  ::simt::ldmatrix(t, addr, 1, false);
  r[0] = t[0];
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  uint32_t t[4];
  ::simt::ldmatrix(t, addr, 2, false);
  r[0] = t[0], r[1] = t[1];
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  ::simt::ldmatrix(r, addr, 4, false);
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], uint32_t addr) {
  uint32_t t[4];
  ::simt::ldmatrix(t, addr, 1, true);
  r[0] = t[0];
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  uint32_t t[4];
  ::simt::ldmatrix(t, addr, 2, true);
  r[0] = t[0], r[1] = t[1];
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  ::simt::ldmatrix(r, addr, 4, true);
}
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "mma_16816: bf16 or f16 inputs");
  ::simt::mma_16816(d, a, b0, b1, std::is_same_v<T, __nv_bfloat16>);
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  ::simt::cp_async(dst, src, 16, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  ::simt::cp_async(dst, src, 4, valid ? 4 : 0);
}
__device__ __forceinline__ void cp_async_commit() {
  ::simt::cp_async_commit();
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  ::simt::cp_async_wait(N);
}
// MUFU.EX2 has a relative error of about 2^-22 and flushes subnormal results; the emulator
// uses the host's exp2f (correctly rounded or nearly so) with the same flush, so emulated
// flash results may differ from a GPU's in the last bits (never at 0 -> 1 or -inf -> 0).
__device__ __forceinline__ float ex2_approx(float x) {
  ::simt::count_math_call(3);  // MUFU.EX2: counted as exp2f (LaunchTraffic::calls_exp2f)
  if (std::isnan(x)) return x;
  const float ftz_x = std::fpclassify(x) == FP_SUBNORMAL ? 0.0f : x;
  const float y = std::exp2(ftz_x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

#else  // the GPU

__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// d += a * b on one m16n8k16 tile; T selects bf16 or f16 inputs. FP32 accumulation.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "mma_16816: bf16 or f16 inputs");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// 16-byte global -> shared copy; valid = false writes 16 zero bytes and reads nothing
// (src-size 0), so rows past T come in as zeros (finite: 0 * P = 0 in the MMAs).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
// 4-byte version (lse, delta rows); invalid rows read as 0.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// 2^x (MUFU, relative error ~2^-22, subnormal results flushed to 0; ex2(0) = 1 and
// ex2(-inf) = 0 exactly).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#endif

}  // namespace st::ptx
