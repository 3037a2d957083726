// SIMT emulator: runs the project's CUDA kernels (cuda/*.cu compiled as host C++) on the CPU,
// for the tests only (never linked into the product). See tests/simt/README.md.
//
// Execution model. A launch runs its blocks one after another (in an order permuted by the
// schedule seed). Every CUDA thread of a block is a fiber (Boost.Context) with its own stack;
// fibers switch only at synchronisation points: __syncthreads (block barrier), the warp
// collectives (__syncwarp, __shfl_*_sync, __ballot_sync, __any/__all_sync, ldmatrix,
// mma.sync) and thread exit. Which ready fiber runs next is chosen by a seeded generator,
// so two seeds give two different legal interleavings; a kernel without races gives the
// same bits under both.
//
// Checks (each one fails the launch: cudaGetLastError() returns an error whose string
// names the kernel, block, thread and address):
//  - shared memory: every access of the kernel code is seen (the kernel sources are
//    compiled with -fsanitize=thread, whose __tsan_read/__tsan_write hooks this runtime
//    implements instead of libtsan; see simt.cpp), as are the accesses of the emulated
//    ldmatrix / cp.async. Out-of-bounds (redzones around every shared variable), reads of
//    bytes no thread of the block wrote, and races: a byte written by one thread and read
//    or written by another with no __syncthreads (or __syncwarp within one warp) between.
//  - launch limits as the driver enforces them for sm_90: block size, grid size, dynamic
//    shared memory over 48 KB without cudaFuncSetAttribute(MaxDynamicSharedMemorySize),
//    static + dynamic over 227 KB;
//  - collectives: every lane named in a mask must arrive at the same collective; a thread
//    that exits while others wait for it, or a barrier nobody can pass, is a deadlock.
#pragma once
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"

// ------------------------------------------------------------------ CUDA vocabulary

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) {
  return float2{x, y};
}

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

namespace simt {

// ------------------------------------------------------------------ runtime interface


// The thread now running (null outside a launch). Read by threadIdx & co.
struct ThreadRegs {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
extern ThreadRegs* g_regs;

// Launch `body` (which calls the kernel) on grid x block with `dyn_smem` bytes of dynamic
// shared memory. `kernel` identifies the function for cudaFuncSetAttribute. Errors are
// recorded for cudaGetLastError().
void launch(const void* kernel, const char* name, dim3 grid, dim3 block, size_t dyn_smem,
            const std::function<void()>& body);

// Settings of the emulator (tests set them).
struct Options {
  uint64_t schedule_seed = 0;  // 0: round-robin in thread order; else seeded random choice
  bool check_races = true;
  bool check_uninit = true;
  bool count_traffic = false;  // record global-memory traffic (traffic_log())
  uint64_t max_blocks = 0;     // > 0: run at most this many blocks of a launch (evenly spread)
};
Options& options();

// ---- global-memory traffic of launches (the cost model's input; tests/simt/cost/)
// With Options::count_traffic set, every global access of the instrumented kernel code (and
// every cp.async source) is recorded. Lanes of one warp that execute the same instruction
// (the hook's caller address) for the same n-th time form one warp request, as on the GPU;
// a request touches the 32-byte sectors its lanes' bytes fall in, so an uncoalesced request
// costs as many sectors as it does on the GPU. Each launch appends one LaunchTraffic.
// Options::max_blocks > 0 runs only that many blocks of a larger grid, spread evenly over
// it (same order for every seed); the counts are those of the blocks run, and
// blocks_run / blocks_total says how much to scale them.
// Compute-side counts (issue 43, the fields at the end; same switch, same scaling): mma.sync
// and ldmatrix warp instructions, barriers released, and shared-memory wavefronts: 32 banks
// of 4 bytes, a warp request costs the largest number of distinct 4-byte words it touches
// in one bank (ldmatrix: per 8x8 matrix, its 8 rows of 16 bytes; generic shared loads and
// stores grouped into warp requests as the global ones are). cp.async's shared writes are
// not counted.
struct LaunchTraffic {
  std::string kernel;                  // the kernel's parameter types (as in failures)
  uint64_t blocks_total = 0, blocks_run = 0;
  unsigned threads_per_block = 0;      // blockDim.x * y * z
  size_t smem_bytes = 0;               // static + dynamic shared memory of one block
  uint64_t requests_rd = 0, requests_wr = 0;  // warp requests
  uint64_t sectors_rd = 0, sectors_wr = 0;    // sectors summed over requests
  uint64_t unique_rd = 0, unique_wr = 0;      // distinct sectors read (before any write
                                              // of theirs in this launch) / written
  uint64_t bytes_rd = 0, bytes_wr = 0;        // bytes the lanes asked for
  // Dependent memory rounds of the slowest thread: a thread's global loads between two
  // switch points (barriers, warp collectives, exit) may be in flight together, up to U at a
  // time, so a stretch with n loads costs ceil(n / U) rounds; rounds[k] uses U = 2^k (the
  // last, U = 1024, is in practice the number of stretches that load anything). Only
  // loads that touch a sector the block has not read yet count (others are L1 hits).
  static constexpr int kRoundWidths = 11;  // U = 1, 2, 4, ..., 1024 (about: one per stretch)
  uint64_t rounds[kRoundWidths] = {};
  // Calls of the FP32 transcendental functions (expf, logf, tanhf, exp2f) by all threads
  // run, counted only in the kernel sources compiled with tests/simt/count_math.h.
  uint64_t calls_expf = 0, calls_logf = 0, calls_tanhf = 0, calls_exp2f = 0;
  // ---- compute-side counts (issue 43)
  uint64_t mma_sync = 0;          // mma.sync.m16n8k16 warp instructions executed
  uint64_t wgmma_insts = 0;       // wgmma.mma_async warpgroup instructions (filled by the Hopper emulation)
  uint64_t wgmma_macs = 0;        // sum of M*N*K over them (filled by the Hopper emulation)
  uint64_t ldsm_insts = 0, ldsm_wavefronts = 0;   // ldmatrix warp instructions, shared wavefronts they cost
  uint64_t smem_requests = 0, smem_wavefronts = 0; // generic shared loads/stores: warp requests, wavefronts (bank conflicts)
  uint64_t barriers = 0;          // __syncthreads executed per block, summed over blocks run
  uint64_t tma_bytes = 0;         // bytes moved by TMA bulk copies (filled by the Hopper emulation)
  // Per block run, in run order: its index and its own compute counts (the deltas of the
  // counters above over the block), for the cost model's schedule of unequal blocks (the
  // causal attention grids). Filled at each block's end, so any counter a kernel's
  // emulation adds to during the block (wgmma, TMA) is split per block too.
  struct BlockCounts {
    uint3 idx;
    uint64_t mma_sync, wgmma_macs, ldsm_wavefronts, smem_wavefronts, barriers, calls_exp2f,
        tma_bytes;
  };
  std::vector<BlockCounts> blocks;
  uint3 grid{1, 1, 1};  // the launch's grid (blocks[].idx lie in it)
};
std::vector<LaunchTraffic>& traffic_log();
void count_math_call(int which);  // 0 expf, 1 logf, 2 tanhf, 3 exp2f (count_math.h)

// Errors: the first failure of the last failing launch, and a count of failed launches.
const std::string& last_failure();
uint64_t failures();
// Launch statistics (for the coverage table): launches and blocks/threads run.
struct Stats {
  uint64_t launches = 0, blocks = 0, threads = 0, switches = 0;
};
Stats& stats();

// Fails the running launch with `msg` (the kernel stops at this point; nothing after it in
// this launch runs).
[[noreturn]] void kernel_fail(const std::string& msg);

// ---- shared memory
void* shared_static(const void* tag, size_t bytes, size_t align, const char* what);
void* shared_dynamic(size_t align);
uint32_t shared_address(const void* p);  // __cvta_generic_to_shared
// Explicit checked accesses by the running thread (ldmatrix/cp.async use these).
void shared_read(uint32_t addr, void* dst, size_t bytes);
void shared_write(uint32_t addr, const void* src, size_t bytes);

// ---- barriers and warp collectives (all return once every participant has arrived)
void syncthreads();
int syncthreads_count(int pred, int op);  // op 0: count, 1: and, 2: or
void syncwarp(unsigned mask);
enum class Shfl { Idx, Up, Down, Xor };
uint64_t shfl(unsigned mask, uint64_t v, int bytes, Shfl mode, int arg, int width);
unsigned vote(unsigned mask, bool pred, int op);  // op 0: ballot, 1: any, 2: all
// Tensor-core / ldmatrix collectives (ptx.h): the runtime gathers every lane's operands.
void ldmatrix(uint32_t (&r)[4], uint32_t addr, int num, bool trans);
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16);
// cp.async: issue (copied at completion), commit, wait.
void cp_async(uint32_t dst, const void* src, int cp_size, int src_size);
void cp_async_commit();
void cp_async_wait(int n);

// ---- Hopper (sm_90a): mbarrier, TMA, wgmma, named barriers (README.md, "Hopper")
// Stand-in for CUtensorMap (an opaque 128-byte object on the GPU, made on the host by
// cuTensorMapEncodeTiled): a tiled view of a global tensor of rank 1..3, dimension 0
// contiguous, with the box a TMA copy moves and the shared-memory swizzle it applies.
struct TensorMap {
  static constexpr uint32_t kMagic = 0x544d4150u;  // "TMAP": made by make_tensor_map
  uint32_t magic = 0;
  const void* base = nullptr;
  int rank = 0, elem_bytes = 0;
  uint64_t dims[3] = {1, 1, 1};
  uint64_t strides[3] = {0, 0, 0};  // bytes; strides[0] = elem_bytes
  uint32_t box[3] = {1, 1, 1};
  int swizzle = 0;                  // bytes: 0 (none), 32, 64 or 128
};
// Checks the arguments as cuTensorMapEncodeTiled does (the subset the kernels use: 16-bit
// elements, OOB fill with zeros, element strides 1); throws std::invalid_argument.
TensorMap make_tensor_map(const void* base, int rank, int elem_bytes, const uint64_t* dims,
                          const uint64_t* strides_bytes, const uint32_t* box, int swizzle);

// mbarrier.init / arrive / arrive.expect_tx / try_wait.parity (blocking until the phase of
// that parity has completed). A barrier lives at an 8-byte-aligned shared address.
void mbar_init(uint32_t addr, uint32_t count);
void mbar_arrive(uint32_t addr);
void mbar_arrive_expect_tx(uint32_t addr, uint32_t bytes);
void mbar_wait(uint32_t addr, uint32_t parity);
// cp.async.bulk.tensor.{1,2,3}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes:
// the box at coords (rank of them) into shared memory at dst, completing on mbar.
void tma_load(uint32_t dst, const TensorMap* map, const int* coords, uint32_t mbar);
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}: D (64 x N, this warp's 16 rows: the
// lane's n/2 accumulators in d, mma.m16n8 C-fragment order per 8 columns) = A (64 x 16) B
// (16 x N) + (scale_d ? D : 0). A from the descriptor da (a_regs null) or from registers
// (a_regs: the lane's 4 A-fragment registers of its warp's 16 rows); B from db. tnsp_a,
// tnsp_b: 0 K-major, 1 MN-major (transposed). Asynchronous: it runs at the wgmma.wait_group
// that retires its group, reading shared memory and the accumulators then.
void wgmma(float* d, int n, const uint32_t* a_regs, uint64_t da, uint64_t db, bool scale_d,
           int tnsp_a, int tnsp_b, bool bf16);
void wgmma_commit();
void wgmma_wait(int n);
// bar.sync id, count (wait) / bar.arrive id, count; id 1..15 (0 is __syncthreads').
void named_barrier(int id, int count, bool wait);
// setmaxnreg.{inc,dec}.sync.aligned.u32: checks the operand (24..256, a multiple of 8).
void setmaxnreg(int regs);
// The byte address the descriptor desc (wgmma's shared-memory matrix descriptor) gives to
// element (mn, k) of a 16-bit operand, K-major (mn_major false) or MN-major: the layouts
// of the PTX ISA's "matrix descriptor" section, swizzle included. Exposed for the tests.
uint32_t wgmma_desc_address(uint64_t desc, bool mn_major, int mn, int k);

// ---- host side of the CUDA runtime
void set_max_dynamic_smem(const void* kernel, int bytes);

}  // namespace simt

// ------------------------------------------------------------------ device built-ins

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

#define threadIdx (::simt::g_regs->thread_idx)
#define blockIdx (::simt::g_regs->block_idx)
#define blockDim (::simt::g_regs->block_dim)
#define gridDim (::simt::g_regs->grid_dim)

inline void __syncthreads() {
  ::simt::syncthreads();
}
inline int __syncthreads_or(int p) {
  return ::simt::syncthreads_count(p, 2);
}
inline int __syncthreads_and(int p) {
  return ::simt::syncthreads_count(p, 1);
}
inline int __syncthreads_count(int p) {
  return ::simt::syncthreads_count(p, 0);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::simt::syncwarp(mask);
}

namespace simt {
template <class T>
T shfl_t(unsigned mask, T v, Shfl mode, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shfl of up to 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  u = shfl(mask, u, static_cast<int>(sizeof(T)), mode, arg, width);
  T r;
  std::memcpy(&r, &u, sizeof(T));
  return r;
}
}  // namespace simt
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return ::simt::shfl_t(mask, v, ::simt::Shfl::Idx, src, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return ::simt::shfl_t(mask, v, ::simt::Shfl::Up, static_cast<int>(d), width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return ::simt::shfl_t(mask, v, ::simt::Shfl::Down, static_cast<int>(d), width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
  return ::simt::shfl_t(mask, v, ::simt::Shfl::Xor, m, width);
}
inline unsigned __ballot_sync(unsigned mask, int p) {
  return ::simt::vote(mask, p != 0, 0);
}
inline int __any_sync(unsigned mask, int p) {
  return static_cast<int>(::simt::vote(mask, p != 0, 1));
}
inline int __all_sync(unsigned mask, int p) {
  return static_cast<int>(::simt::vote(mask, p != 0, 2));
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
inline size_t __cvta_generic_to_shared(const void* p) {
  return ::simt::shared_address(p);
}

// Static and dynamic shared memory (cuda/launch.cuh's ST_SHARED / ST_SHARED_DYNAMIC).
namespace simt {
template <class A>
A& shared_array(const void* tag, const char* name) {
  return *static_cast<A*>(shared_static(tag, sizeof(A), alignof(A), name));
}
}  // namespace simt

// ---- FP32/FP64 intrinsics: IEEE operations with the stated rounding. The kernel sources
// are compiled with -ffp-contract=off (no FMA contraction), as nvcc --fmad=false.
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
// Bit casts: core/dtype.h's (a reinterpretation, nothing rounded: the 16-bit conversions
// below stay the emulator's own).
inline float __uint_as_float(uint32_t u) {
  return ::st::bits_float(u);
}
inline uint32_t __float_as_uint(float f) {
  return ::st::float_bits(f);
}
namespace simt {
float double_to_float(double x, int mode);  // 0: rn, 1: rz, 2: ru, 3: rd
}
inline float __double2float_rn(double x) {
  return ::simt::double_to_float(x, 0);
}
inline float __double2float_rz(double x) {
  return ::simt::double_to_float(x, 1);
}
inline float __double2float_ru(double x) {
  return ::simt::double_to_float(x, 2);
}
inline float __double2float_rd(double x) {
  return ::simt::double_to_float(x, 3);
}
using std::fmaxf;
using std::fminf;
using std::isfinite;
using std::isinf;
using std::isnan;
template <class A, class B>
inline auto min(A a, B b) -> std::common_type_t<A, B> {
  return b < a ? b : a;
}
template <class A, class B>
inline auto max(A a, B b) -> std::common_type_t<A, B> {
  return a < b ? b : a;
}

// ---- 16-bit formats (cuda_bf16.h / cuda_fp16.h): storage structs and the conversions the
// kernels use, implemented here from the IEEE definitions (not from core/dtype.h, so the
// tests comparing the two are independent).
struct __nv_bfloat16 {
  unsigned short __x;
};
struct __half {
  unsigned short __x;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
struct alignas(4) __half2 {
  __half x, y;
};
namespace simt {
uint16_t f32_to_bf16_rn(float x);
uint16_t f32_to_f16_rn(float x);
float f16_to_f32(uint16_t h);
}  // namespace simt
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  return __nv_bfloat16{::simt::f32_to_bf16_rn(x)};
}
inline __nv_bfloat16 __float2bfloat16(float x) {
  return __float2bfloat16_rn(x);
}
inline float __bfloat162float(__nv_bfloat16 h) {
  return __uint_as_float(static_cast<uint32_t>(h.__x) << 16);
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) {
  return h.__x;
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  return __nv_bfloat16{u};
}
inline __half __float2half_rn(float x) {
  return __half{::simt::f32_to_f16_rn(x)};
}
inline __half __float2half(float x) {
  return __float2half_rn(x);
}
inline float __half2float(__half h) {
  return ::simt::f16_to_f32(h.__x);
}
inline unsigned short __half_as_ushort(__half h) {
  return h.__x;
}
inline __half __ushort_as_half(unsigned short u) {
  return __half{u};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
inline __half2 __floats2half2_rn(float lo, float hi) {
  return __half2{__float2half_rn(lo), __float2half_rn(hi)};
}
inline float2 __half22float2(__half2 h) {
  return float2{__half2float(h.x), __half2float(h.y)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) {
  return float2{__bfloat162float(h.x), __bfloat162float(h.y)};
}

// ------------------------------------------------------------------ host runtime API

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
template <class F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  if (value < 0 || value > 227 * 1024) return cudaErrorInvalidValue;
  ::simt::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), value);
  return cudaSuccess;
}
