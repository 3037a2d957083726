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
// Hopper (sm_90; wgmma and setmaxnreg sm_90a), for cuda/flash_fwd_sm90.cuh:
//   mbar_init / mbar_arrive / mbar_arrive_expect_tx / mbar_wait(bar, parity)
//                                       mbarrier.{init,arrive,arrive.expect_tx,try_wait.parity}
//   fence_mbarrier_init, fence_proxy_async  fence.mbarrier_init / fence.proxy.async.shared::cta
//   tma_load_3d(dst, map, c0, c1, c2, bar)  cp.async.bulk.tensor.3d ... complete_tx::bytes
//   make_tma_3d(...)                    the tensor map (host: cuTensorMapEncodeTiled)
//   wgmma_desc(addr, lbo, sbo, swizzle) a shared-memory matrix descriptor
//   wgmma_ss<T, N, TA, TB>, wgmma_rs<T, N, TB>  wgmma.mma_async.sync.aligned.m64nNk16.f32
//   wgmma_fence, wgmma_commit, wgmma_wait<N>    wgmma.{fence,commit_group,wait_group}
//   fence_operand(d)                    a compiler barrier on accumulator registers
//   named_bar_sync / named_bar_arrive(id, n)    bar.sync / bar.arrive
//   setmaxnreg_inc<R> / setmaxnreg_dec<R>
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
#else
#include <cuda.h>
#include <cudaTypedefs.h>
#endif
#include <stdexcept>
#include <string>

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


// ---- Hopper (the emulator's implementations: tests/simt/README.md, "Hopper")
using TmaMap = ::simt::TensorMap;
#define ST_GRID_CONSTANT
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  ::simt::mbar_init(bar, count);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  ::simt::mbar_arrive(bar);
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  ::simt::mbar_arrive_expect_tx(bar, bytes);
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  ::simt::mbar_wait(bar, parity);
}
// The emulator is sequentially consistent between switch points: the fences order nothing
// more there (README.md says what only a GPU can check).
__device__ __forceinline__ void fence_mbarrier_init() {}
__device__ __forceinline__ void fence_proxy_async() {}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TmaMap& map, int c0, int c1,
                                            int c2, uint32_t bar) {
  const int c[3] = {c0, c1, c2};
  ::simt::tma_load(dst, &map, c, bar);
}
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_commit() {
  ::simt::wgmma_commit();
}
// The accumulators' registers pinned at this point of the program (a compiler barrier on the
// GPU, as CUTLASS's warpgroup_fence_operand); nothing to do here.
template <int N>
__device__ __forceinline__ void fence_operand(float (&)[N]) {}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  ::simt::wgmma_wait(N);
}
template <class T, int N, int TA, int TB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db,
                                         bool scale_d) {
  ::simt::wgmma(d, N, nullptr, da, db, scale_d, TA, TB, std::is_same_v<T, __nv_bfloat16>);
}
template <class T, int N, int TB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db,
                                         bool scale_d) {
  ::simt::wgmma(d, N, a, 0, db, scale_d, 0, TB, std::is_same_v<T, __nv_bfloat16>);
}
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  ::simt::named_barrier(id, count, true);
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  ::simt::named_barrier(id, count, false);
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  ::simt::setmaxnreg(R);
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  ::simt::setmaxnreg(R);
}
// A 3-D tiled tensor map over 16-bit elements (dims[0] contiguous), OOB filled with zeros.
inline TmaMap make_tma_3d(const void* base, const uint64_t (&dims)[3],
                          const uint64_t (&strides_bytes)[2], const uint32_t (&box)[3],
                          int swizzle) {
  return ::simt::make_tensor_map(base, 3, 2, dims, strides_bytes, box, swizzle);
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


// ---- Hopper. TMA and mbarrier: sm_90; wgmma and setmaxnreg: sm_90a (the kernels that use
// them are built for compute_90a only, cuda/CMakeLists.txt); elsewhere they trap.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ST_SM90A 1
#else
#define ST_SM90A 0
#endif
using TmaMap = CUtensorMap;
#define ST_GRID_CONSTANT __grid_constant__
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Spins on try_wait.parity (which itself suspends for a system-dependent time) until the
// phase of `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TmaMap& map, int c0, int c1,
                                            int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void wgmma_fence() {
#if ST_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  asm volatile("trap;");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if ST_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  asm volatile("trap;");
#endif
}
// Pins the accumulators' registers at this point of the program: the compiler may not move
// their reads or writes across it (and so across the wgmma issue or wait it stands beside).
template <int N>
__device__ __forceinline__ void fence_operand(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if ST_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  asm volatile("trap;");
#endif
}
#if ST_SM90A
#include "cuda/wgmma_ptx.inc"
#endif
template <class T, int N, int TA, int TB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t da, uint64_t db,
                                         bool scale_d) {
#if ST_SM90A
  constexpr bool bf = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (N == 32 && bf) wgmma_ss_m64n32k16_bf16<TA, TB>(d, da, db, scale_d);
  if constexpr (N == 32 && !bf) wgmma_ss_m64n32k16_f16<TA, TB>(d, da, db, scale_d);
  if constexpr (N == 64 && bf) wgmma_ss_m64n64k16_bf16<TA, TB>(d, da, db, scale_d);
  if constexpr (N == 64 && !bf) wgmma_ss_m64n64k16_f16<TA, TB>(d, da, db, scale_d);
  if constexpr (N == 128 && bf) wgmma_ss_m64n128k16_bf16<TA, TB>(d, da, db, scale_d);
  if constexpr (N == 128 && !bf) wgmma_ss_m64n128k16_f16<TA, TB>(d, da, db, scale_d);
  static_assert(N == 32 || N == 64 || N == 128,
                "wgmma_ss: N = 32, 64 or 128 (tools/gen/gen_wgmma_ptx.py)");
#else
  asm volatile("trap;");
#endif
}
template <class T, int N, int TB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db,
                                         bool scale_d) {
#if ST_SM90A
  constexpr bool bf = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (N == 32 && bf) wgmma_rs_m64n32k16_bf16<TB>(d, a, db, scale_d);
  if constexpr (N == 32 && !bf) wgmma_rs_m64n32k16_f16<TB>(d, a, db, scale_d);
  if constexpr (N == 64 && bf) wgmma_rs_m64n64k16_bf16<TB>(d, a, db, scale_d);
  if constexpr (N == 64 && !bf) wgmma_rs_m64n64k16_f16<TB>(d, a, db, scale_d);
  if constexpr (N == 128 && bf) wgmma_rs_m64n128k16_bf16<TB>(d, a, db, scale_d);
  if constexpr (N == 128 && !bf) wgmma_rs_m64n128k16_f16<TB>(d, a, db, scale_d);
  static_assert(N == 32 || N == 64 || N == 128,
                "wgmma_rs: N = 32, 64 or 128 (tools/gen/gen_wgmma_ptx.py)");
#else
  asm volatile("trap;");
#endif
}
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#if ST_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#if ST_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
// A 3-D tiled tensor map over 16-bit elements (dims[0] contiguous), OOB filled with zeros,
// through the driver's cuTensorMapEncodeTiled (fetched from the runtime: no -lcuda).
inline TmaMap make_tma_3d(const void* base, const uint64_t (&dims)[3],
                          const uint64_t (&strides_bytes)[2], const uint32_t (&box)[3],
                          int swizzle) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
      throw std::runtime_error("flash attention (sm_90): the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  TmaMap m;
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUtensorMapSwizzle sw = swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                : swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                : CU_TENSOR_MAP_SWIZZLE_NONE;
  const CUresult rc = encode(&m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(base),
                             dims, strides_bytes, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS)
    throw std::runtime_error("flash attention (sm_90): cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(static_cast<int>(rc)));
  return m;
}

#endif

// A wgmma shared-memory matrix descriptor (PTX ISA, "matrix descriptor"): start address,
// leading and stride byte offsets (16-byte units, 14 bits each), base offset 0, and the
// swizzle mode (0 none, 1 128-byte, 2 64-byte, 3 32-byte).
__host__ __device__ constexpr uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                                  int swizzle_bytes) {
  const uint64_t mode = swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : swizzle_bytes == 32 ? 3 : 0;
  return (uint64_t{(addr >> 4) & 0x3fffu}) | (uint64_t{(lbo >> 4) & 0x3fffu} << 16) |
         (uint64_t{(sbo >> 4) & 0x3fffu} << 32) | (mode << 62);
}

}  // namespace st::ptx
