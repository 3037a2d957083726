// Device building blocks of the flash attention kernels (cuda/flash_fwd.cuh, flash_bwd.cuh):
// inline-PTX wrappers (mma.sync, ldmatrix, cp.async, ex2), exact rounding helpers, and the
// two warp-level GEMM shapes every kernel is made of. Included by .cu files only.
//
// ---- Tensor-core fragments (PTX ISA, mma.m16n8k16 with .bf16/.f16 inputs, .f32 accum) ----
// A warp computes D (16 x 8, FP32) += A (16 x 16) * B (16 x 8). With lane = 0..31,
// g = lane / 4 ("group") and c = lane % 4 ("thread in group"):
//   A: 4 x 32-bit registers, two 16-bit elements each, the lower column in the low half:
//        a0 = A[g][2c, 2c+1]   a1 = A[g+8][2c, 2c+1]   a2 = A[g][2c+8, +9]   a3 = A[g+8][2c+8, +9]
//   B: 2 registers (B is K x N = 16 x 8, "col" layout: consecutive k in one register):
//        b0 = B[2c, 2c+1][g]   b1 = B[2c+8, 2c+9][g]
//   C/D: 4 floats:  d0, d1 = D[g][2c, 2c+1]   d2, d3 = D[g+8][2c, 2c+1]
// A C fragment pair (n-blocks 2j, 2j+1 = 16 columns) is exactly the A fragment of the
// k-step j when those 16 columns are the k index of the next product: c_to_a() below.
// That is how P (and dS) go from one MMA's output to the next MMA's input in registers.
//
// ---- ldmatrix ----
// ldmatrix.x4 loads four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the 8 row
// addresses of matrix i (16 contiguous bytes each). Register i of every lane receives
// matrix i's elements [lane/4][2(lane%4), +1] (non-transposed) or [2(lane%4), +1][lane/4]
// (.trans). So, for a row-major tile X[row][col] in shared memory:
//   lds_a:      A fragment of X[row0 .. +16][k0 .. +16]               (non-trans)
//   lds_b_rows: B fragments of two n-blocks where n = rows n0 .. +16 of X and k = columns
//               k0 .. +16: the B operand of A * X^T (S = Q K^T, dP = dO V^T)  (non-trans)
//   lds_b_cols: B fragments of two n-blocks where k = rows k0 .. +16 of X and n = columns
//               n0 .. +16: the B operand of P * X (O = P V, dQ = dS K)        (.trans)
// Shared tiles are row-major with a pitch of HD + 8 elements: 8 consecutive rows start
// 16 bytes apart modulo 128, so every ldmatrix phase (8 rows x 16 bytes) hits 32 distinct
// banks; cp.async writes 16-byte chunks at the same offsets.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/ptx.cuh"

namespace st::flash {

// ---------------------------------------------------------------- PTX (cuda/ptx.cuh)

using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ex2_approx;
using ptx::smem_addr;

// e^x as the kernels form it: one FP32 multiply by log2(e) and ex2. x = 0 gives exactly 1
// (a tied maximum's P~ is exactly 1, as on the CPU), x = -inf gives 0 (masked scores).
__device__ __forceinline__ float fexp(float x) {
  return ex2_approx(__fmul_rn(x, 1.4426950408889634f));
}

// ---------------------------------------------------------------- formats

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo in the low half
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  } else {
    __half2 h = *reinterpret_cast<__half2*>(&u);
    return __half22float2(h);
  }
}
// x rounded to T (RNE) and widened back, exactly as the CPU's round_fmt of an FP32 value.
template <class T>
__device__ __forceinline__ float round_t(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__float2bfloat16_rn(x));
  } else {
    return __half2float(__float2half_rn(x));
  }
}
template <class T>
__device__ __forceinline__ T to_t(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}
template <class T>
__device__ __forceinline__ float from_t(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

// ---- Correct (single) rounding of a + b, a * b, a / b to T, as the CPU's
// round_fmt(exact, T). An FP32 operation followed by an FP32 -> T rounding could round
// twice; instead the FP32 result s = RN(x) is turned into round-to-odd(x) using the exact
// error e = x - s (TwoSum / FMA residual): if s is inexact and even, step one ulp towards x.
// Round-to-odd at 24 bits then RNE to 8 (bf16) or 11 (fp16) bits equals one RNE from the
// exact x (the FP32 bits kept are >= 2 more than the target's), the same argument as
// round_fmt in core/attention_numerics.cpp. Assumes no FP32 underflow in the error term.
__device__ __forceinline__ float to_odd(float s, float e) {
  if (!isfinite(s) || e == 0.0f) return s;
  const uint32_t u = __float_as_uint(s);
  if (u & 1u) return s;
  if (s == 0.0f) return __uint_as_float(e > 0.0f ? 1u : 0x80000001u);
  const bool away = (e > 0.0f) == (s > 0.0f);  // the exact value lies further from zero
  return __uint_as_float(away ? u + 1u : u - 1u);
}
__device__ __forceinline__ float add_odd(float a, float b) {
  const float s = __fadd_rn(a, b);
  const float bb = __fsub_rn(s, a);
  const float e = __fadd_rn(__fsub_rn(a, __fsub_rn(s, bb)), __fsub_rn(b, bb));  // TwoSum
  return to_odd(s, e);
}
__device__ __forceinline__ float mul_odd(float a, float b) {
  const float p = __fmul_rn(a, b);
  return to_odd(p, __fmaf_rn(a, b, -p));
}
__device__ __forceinline__ float div_odd(float a, float b) {
  const float q = __fdiv_rn(a, b);
  const float r = __fmaf_rn(-q, b, a);  // a - q b, exact
  return to_odd(q, b > 0.0f ? r : -r);
}
template <class T>
__device__ __forceinline__ float add_round(float a, float b) {
  return round_t<T>(add_odd(a, b));
}
template <class T>
__device__ __forceinline__ float mul_round(float a, float b) {
  return round_t<T>(mul_odd(a, b));
}
template <class T>
__device__ __forceinline__ float div_round(float a, float b) {
  return round_t<T>(div_odd(a, b));
}
// A double rounded once to T (or to FP32 when T = float), as round_fmt: round-to-odd at
// FP32 (truncate, set the last bit when inexact), then RNE.
template <class T>
__device__ __forceinline__ float round_double(double x) {
  if constexpr (std::is_same_v<T, float>) {
    return __double2float_rn(x);
  } else {
    if (!isfinite(x)) return static_cast<float>(x);
    float t = __double2float_rz(x);
    if (static_cast<double>(t) != x) t = __uint_as_float(__float_as_uint(t) | 1u);
    return round_t<T>(t);
  }
}

// x rounded to nearest even with `bits` fraction bits (1..21) and FP32's exponent range, as
// the CPU's round_fraction_bits (core/attention_numerics.h): round to odd at FP32
// (truncate, set the last bit when inexact), then RNE at bit 23 - bits on the integer
// encoding (a carry out of the largest finite value lands on Inf). NaN and Inf pass through.
__device__ __forceinline__ float round_bits(double x, int bits) {
  if (!isfinite(x)) return static_cast<float>(x);
  const float t = __double2float_rz(x);
  uint32_t u = __float_as_uint(t);
  if (static_cast<double>(t) != x) u |= 1u;
  const int drop = 23 - bits;
  const uint32_t mag = u & 0x7fffffffu;
  uint32_t r = mag + ((1u << (drop - 1)) - 1u) + ((mag >> drop) & 1u);
  r &= ~((1u << drop) - 1u);
  return __uint_as_float(r | (u & 0x80000000u));
}

// ---------------------------------------------------------------- shared tiles

// Row-major tile of ROWS x HD elements at pitch HD + 8 (see the top of this file).
template <int HD>
constexpr int kPitch = HD + 8;

// cp.async of rows [row0, row0 + ROWS) of a head matrix (row r at g + r * stride, HD
// contiguous elements) into the tile at shared address `dst`; rows >= nrows become zeros.
// Every thread of the block (NT of them) calls it; one 16-byte chunk per step.
template <int ROWS, int HD, int NT, class T>
__device__ __forceinline__ void load_tile(uint32_t dst, const T* g, int64_t stride, int row0,
                                          int nrows, int tid) {
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  constexpr int kTotal = ROWS * kChunks;
  static_assert(kTotal % NT == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int i = 0; i < kTotal / NT; ++i) {
    const int idx = tid + i * NT;
    const int r = idx / kChunks, c = idx % kChunks;
    const int row = row0 + r;
    const bool ok = row < nrows;
    const T* src = g + static_cast<int64_t>(ok ? row : 0) * stride + c * 8;
    ptx::cp_async_16(dst + static_cast<uint32_t>((r * kPitch<HD> + c * 8) * 2), src, ok);
  }
}

template <int PITCH>
__device__ __forceinline__ void lds_a(uint32_t (&a)[4], uint32_t base, int row0, int k0, int lane) {
  const int r = row0 + (lane & 15), c = k0 + ((lane >> 4) << 3);
  ptx::ldmatrix_x4(a, base + static_cast<uint32_t>((r * PITCH + c) * 2));
}
// b[0], b[1]: n-block rows n0 .. n0+7; b[2], b[3]: n-block rows n0+8 .. n0+15.
template <int PITCH>
__device__ __forceinline__ void lds_b_rows(uint32_t (&b)[4], uint32_t base, int n0, int k0,
                                           int lane) {
  const int r = n0 + (lane & 7) + ((lane >> 4) << 3), c = k0 + (((lane >> 3) & 1) << 3);
  ptx::ldmatrix_x4(b, base + static_cast<uint32_t>((r * PITCH + c) * 2));
}
// b[0], b[1]: n-block columns n0 .. n0+7; b[2], b[3]: columns n0+8 .. n0+15.
template <int PITCH>
__device__ __forceinline__ void lds_b_cols(uint32_t (&b)[4], uint32_t base, int k0, int n0,
                                           int lane) {
  const int r = k0 + (lane & 7) + (((lane >> 3) & 1) << 3), c = n0 + ((lane >> 4) << 3);
  ptx::ldmatrix_x4_trans(b, base + static_cast<uint32_t>((r * PITCH + c) * 2));
}

// ---------------------------------------------------------------- warp GEMMs

// acc (16 x 8NB) += A (16 x HD: rows a_row0 .. +16 of the tile at sa) * X^T, X = rows
// x_row0 .. x_row0 + 8NB of the tile at sx (HD columns). S = Q K^T, dP = dO V^T, and the
// transposed S^T = K Q^T, dP^T = V dO^T of the dK/dV kernel.
template <class T, int HD, int NB>
__device__ __forceinline__ void gemm_abt(float (&acc)[NB][4], uint32_t sa, int a_row0, uint32_t sx,
                                         int x_row0, int lane) {
  static_assert(NB % 2 == 0, "n-blocks come in pairs");
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    uint32_t a[4];
    lds_a<kPitch<HD>>(a, sa, a_row0, ks * 16, lane);
#pragma unroll
    for (int nn = 0; nn < NB / 2; ++nn) {
      uint32_t b[4];
      lds_b_rows<kPitch<HD>>(b, sx, x_row0 + nn * 16, ks * 16, lane);
      ptx::mma_16816<T>(acc[2 * nn], a, b[0], b[1]);
      ptx::mma_16816<T>(acc[2 * nn + 1], a, b[2], b[3]);
    }
  }
}
// The same with A already in registers (the forward's Q fragments, one per k-step).
template <class T, int HD, int NB>
__device__ __forceinline__ void gemm_abt_reg(float (&acc)[NB][4], const uint32_t (&a)[HD / 16][4],
                                             uint32_t sx, int x_row0, int lane) {
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
#pragma unroll
    for (int nn = 0; nn < NB / 2; ++nn) {
      uint32_t b[4];
      lds_b_rows<kPitch<HD>>(b, sx, x_row0 + nn * 16, ks * 16, lane);
      ptx::mma_16816<T>(acc[2 * nn], a[ks], b[0], b[1]);
      ptx::mma_16816<T>(acc[2 * nn + 1], a[ks], b[2], b[3]);
    }
  }
}
// acc (16 x HD) += P (16 x K, as A fragments) * X, X = rows x_row0 .. x_row0 + K of the tile
// at sx (HD columns). O = P~ V, dV = P^T dO, dK = dS^T Q, dQ = dS K.
template <class T, int HD, int K>
__device__ __forceinline__ void gemm_pv(float (&acc)[HD / 8][4], const uint32_t (&pa)[K / 16][4],
                                        uint32_t sx, int x_row0, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < HD / 16; ++nn) {
      uint32_t b[4];
      lds_b_cols<kPitch<HD>>(b, sx, x_row0 + kk * 16, nn * 16, lane);
      ptx::mma_16816<T>(acc[2 * nn], pa[kk], b[0], b[1]);
      ptx::mma_16816<T>(acc[2 * nn + 1], pa[kk], b[2], b[3]);
    }
  }
}

// C fragments of NB n-blocks (16 x 8NB, values already representable in T) -> A fragments
// of NB/2 k-steps. Exact: pack2 rounds, but every value is already a T value.
template <class T, int NB>
__device__ __forceinline__ void c_to_a(uint32_t (&pa)[NB / 2][4], const float (&c)[NB][4]) {
#pragma unroll
  for (int kk = 0; kk < NB / 2; ++kk) {
    pa[kk][0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
    pa[kk][1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
    pa[kk][2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    pa[kk][3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}
// Element (nb, e) of the C fragments that c_to_a packed, read back from the A fragments.
template <class T, int NB>
__device__ __forceinline__ float a_elem(const uint32_t (&pa)[NB / 2][4], int nb, int e) {
  const float2 v = unpack2<T>(pa[nb >> 1][((nb & 1) << 1) | (e >> 1)]);
  return (e & 1) ? v.y : v.x;
}

// S = scale * acc in place: one FP32 multiply, or (scores = the low format) the exact
// product rounded once to T. The branch is uniform and sits outside the element loops.
template <class T, int NB>
__device__ __forceinline__ void scale_scores(float (&s)[NB][4], float scale, bool low) {
  if (low) {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = mul_round<T>(s[nb][e], scale);
  } else {
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = __fmul_rn(s[nb][e], scale);
  }
}

// Reductions over the 4 lanes of a quad (the 4 threads holding one fragment row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ int quad_sum_int(int v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace st::flash
