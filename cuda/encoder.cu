// Token + position embedding (layers/encoder_cpu.cpp's arithmetic, bit for bit).
// Forward: out[b,t,:] = round(wte[tok] + wpe[t]): one FP32 add, one rounding.
// Backward, deterministic without atomics and without the host: the B*T positions are
// sorted by token on the device, stably (an LSD radix sort over the token's bytes: per tile
// of 256 positions a digit histogram from warp ballots, one exclusive scan of the
// digit-major histogram, a stable scatter), so each token's positions stand in (b, t)
// order, exactly the CPU's std::stable_sort. Then one warp per token group (its lanes on
// 16-byte vectors of channels) sums the token's dout rows in FP32 in that order, channel by
// channel, and adds the sums to dwte once: round(dwte + sum). Distinct tokens write distinct
// rows, so no two threads touch one element. dwpe: one thread per (t, vector of channels)
// sums over b in order, then round(dwpe + sum). These are the CPU's sums in the CPU's order,
// so the results are bit-identical to it. (The first version, one thread per channel with
// 2-byte loads, was predicted request- and latency-bound by tests/simt/cost; this one is the
// model's answer.)
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

#include <algorithm>

namespace st::cudak {
namespace {

template <class T, int V>
__global__ void encoder_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                       int T_, int C, size_t nvec) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < nvec;
       p += stride) {
    const size_t i = p * V;  // C % V == 0: a vector never crosses a row
    const size_t bt = i / C;
    const int c = static_cast<int>(i - bt * C);
    const int t = static_cast<int>(bt % T_);
    const Vec<T, V> e = load_vec<V>(wte + static_cast<size_t>(tokens[bt]) * C + c);
    const Vec<T, V> q = load_vec<V>(wpe + static_cast<size_t>(t) * C + c);
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(to_float(e.v[k]) + to_float(q.v[k]));
    store_vec<V>(out + i, o);
  }
}

// ---- the stable sort of positions by token (integer work: exact, order-free) ----
constexpr int kSortThreads = 256;  // positions per tile; one per thread; 256 digits
constexpr int kSortWarps = kSortThreads / 32;
constexpr int kScanThreads = 1024;

__device__ __forceinline__ int digit_of(const int32_t* keys, int i, int n, int shift) {
  return i < n ? static_cast<int>((static_cast<uint32_t>(keys[i]) >> shift) & 255u) : -1;
}

// The lanes of this warp holding the same digit d (-1: no item), from 9 full-warp ballots
// (every lane of the warp takes part).
__device__ __forceinline__ unsigned peers_of(int d) {
  unsigned m = __ballot_sync(0xffffffffu, d >= 0);
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const bool bit = d >= 0 && ((d >> b) & 1) != 0;
    const unsigned set = __ballot_sync(0xffffffffu, bit);
    m &= bit ? set : ~set;
  }
  return d >= 0 ? m : 0u;
}

// Per-warp digit counts of one tile into wcount[warp][256] (zeroed here), and each item's
// rank among the equal digits of its warp before it.
__device__ __forceinline__ int tile_histogram(int (*wcount)[256], int d, int* rank_in_warp) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int k = threadIdx.x; k < kSortWarps * 256; k += kSortThreads) wcount[k / 256][k % 256] = 0;
  __syncthreads();
  const unsigned peers = peers_of(d);
  *rank_in_warp = __popc(peers & ((1u << lane) - 1u));
  // the highest lane of each group of peers writes the group's count
  if (d >= 0 && (peers >> lane) == 1u) wcount[warp][d] = __popc(peers);
  __syncthreads();
  return warp;
}

// counts[d * tiles + tile] = how many positions of the tile have digit d.
__global__ void __launch_bounds__(kSortThreads)
    radix_count_kernel(int32_t* counts, const int32_t* keys, int n, int shift, int tiles) {
  ST_SHARED(int, wcount, [kSortWarps][256]);
  const int i = blockIdx.x * kSortThreads + threadIdx.x;
  int rank;
  tile_histogram(wcount, digit_of(keys, i, n, shift), &rank);
  const int d = threadIdx.x;
  int c = 0;
  for (int w = 0; w < kSortWarps; ++w) c += wcount[w][d];
  counts[static_cast<size_t>(d) * tiles + blockIdx.x] = c;
}

// In place: x[i] = sum of x[j] for j < i (one block; integers, so any order is exact).
__global__ void __launch_bounds__(kScanThreads) exclusive_scan_kernel(int32_t* x, int m) {
  ST_SHARED(int, wsum, [32]);
  const int per = (m + kScanThreads - 1) / kScanThreads;
  const int lo = min(m, static_cast<int>(threadIdx.x) * per), hi = min(m, lo + per);
  int s = 0;
  for (int i = lo; i < hi; ++i) s += x[i];
  // inclusive scan of the chunk sums: within warps, then across the warp totals
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int v = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  if (lane == 31) wsum[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kScanThreads / 32 ? wsum[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += u;
    }
    wsum[lane] = w;
  }
  __syncthreads();
  int run = v - s + (warp > 0 ? wsum[warp - 1] : 0);  // sum of everything before the chunk
  for (int i = lo; i < hi; ++i) {
    const int xi = x[i];
    x[i] = run;
    run += xi;
  }
}

// Stable scatter of one tile: items keep their order among equal digits. vals_in null:
// the values are the positions themselves.
__global__ void __launch_bounds__(kSortThreads)
    radix_scatter_kernel(int32_t* keys_out, int32_t* vals_out, const int32_t* keys_in,
                         const int32_t* vals_in, const int32_t* offsets, int n, int shift,
                         int tiles) {
  ST_SHARED(int, wcount, [kSortWarps][256]);
  const int i = blockIdx.x * kSortThreads + threadIdx.x;
  const int d = digit_of(keys_in, i, n, shift);
  int rank;
  const int warp = tile_histogram(wcount, d, &rank);
  if (d < 0) return;
  for (int w = 0; w < warp; ++w) rank += wcount[w][d];
  const int dst = offsets[static_cast<size_t>(d) * tiles + blockIdx.x] + rank;
  keys_out[dst] = keys_in[i];
  vals_out[dst] = vals_in ? vals_in[i] : i;
}

// dwte: one warp per sorted position (a grid-stride loop over warps); the warp holding the
// first position of a group of equal tokens sums the group, its lanes covering the channels
// in vectors of V elements (16-byte loads and stores when V > 1). Each channel's sum runs
// over the group's positions in order from 0.0f, then round(dwte + sum): the CPU's.
template <class T, int V>
__global__ void encoder_dwte_kernel(T* dwte, const T* dout, const int32_t* keys,
                                    const int32_t* pos, int n, int C) {
  const int lane = threadIdx.x % 32;
  const int warps = static_cast<int>(gridDim.x * (blockDim.x / 32));
  for (int i = static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32); i < n;
       i += warps) {
    const int token = keys[i];
    if (i > 0 && keys[i - 1] == token) continue;  // not the first of its group
    int end = i + 1;
    while (end < n && keys[end] == token) ++end;
    T* w = dwte + static_cast<size_t>(token) * C;
    for (int c = lane * V; c < C; c += 32 * V) {
      float acc[V];
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = 0.0f;
      for (int j = i; j < end; ++j) {
        const Vec<T, V> d = load_vec<V>(dout + static_cast<size_t>(pos[j]) * C + c);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_float(d.v[k]);
      }
      Vec<T, V> wv = load_vec<V>(w + c);
#pragma unroll
      for (int k = 0; k < V; ++k) wv.v[k] = from_float<T>(to_float(wv.v[k]) + acc[k]);
      store_vec<V>(w + c, wv);
    }
  }
}

// dwpe: one thread per (t, vector of V channels) sums over b in order, then
// round(dwpe + sum).
template <class T, int V>
__global__ void encoder_dwpe_kernel(T* dwpe, const T* dout, int B, int T_, int C) {
  const int t = blockIdx.x;
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * V;
  if (c >= C) return;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  for (int b = 0; b < B; ++b) {
    const Vec<T, V> d = load_vec<V>(dout + (static_cast<size_t>(b) * T_ + t) * C + c);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += to_float(d.v[k]);
  }
  T* w = dwpe + static_cast<size_t>(t) * C + c;
  Vec<T, V> wv = load_vec<V>(w);
#pragma unroll
  for (int k = 0; k < V; ++k) wv.v[k] = from_float<T>(to_float(wv.v[k]) + acc[k]);
  store_vec<V>(w, wv);
}

constexpr int kThreads = 256;
constexpr int kChannelThreads = 128;
constexpr int kGroupBlocks = 4096;  // blocks of the dwte kernel (its warps stride over positions)

}  // namespace

void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                     int T, int C, DType dtype, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * C;
  if (n == 0) return;
  dispatch_storage(dtype, "encoder_forward", [&](auto tag) {
    using T_ = typename decltype(tag)::type;
    constexpr int W = kWide<T_>;
    const bool wide = C % W == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    if (wide) {
      cudak::launch(encoder_forward_kernel<T_, W>, grid_for(n / W, kThreads), kThreads, 0, stream,
                    static_cast<T_*>(out), tokens, static_cast<const T_*>(wte),
                    static_cast<const T_*>(wpe), T, C, n / W);
    } else {
      cudak::launch(encoder_forward_kernel<T_, 1>, grid_for(n, kThreads), kThreads, 0, stream,
                    static_cast<T_*>(out), tokens, static_cast<const T_*>(wte),
                    static_cast<const T_*>(wpe), T, C, n);
    }
    ST_CUDA_CHECK_LAUNCH("encoder_forward_kernel");
  });
}

int sort_tiles(int n) {
  return (n + kSortThreads - 1) / kSortThreads;
}

// Bytes of the token: 1 to 4 passes of 8 bits.
int sort_passes(int rows) {
  int passes = 1;
  for (uint32_t m = static_cast<uint32_t>(rows > 0 ? rows - 1 : 0) >> 8; m; m >>= 8) ++passes;
  return passes;
}

size_t encoder_backward_scratch(int n) {
  return 4 * static_cast<size_t>(n) + 256 * static_cast<size_t>(sort_tiles(n));
}

void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                      int C, int rows, DType dtype, int32_t* scratch, cudaStream_t stream) {
  if (C == 0 || B == 0 || T == 0) return;
  const int n = B * T;
  const unsigned ctiles = static_cast<unsigned>((C + kChannelThreads - 1) / kChannelThreads);
  ST_CHECK(ctiles <= 65535u, "encoder_backward: C = ", C, " is too wide");
  const int tiles = sort_tiles(n);
  ST_CHECK(256ull * static_cast<unsigned long long>(tiles) < (1ull << 31),
           "encoder_backward: B*T = ", n, " is too large for the device sort");
  int32_t* buf[2][2] = {{scratch, scratch + n}, {scratch + 2 * static_cast<size_t>(n),
                                                  scratch + 3 * static_cast<size_t>(n)}};
  int32_t* counts = scratch + 4 * static_cast<size_t>(n);
  const int32_t* keys = tokens;
  const int32_t* vals = nullptr;
  const int passes = sort_passes(rows);
  for (int p = 0; p < passes; ++p) {
    int32_t* ko = buf[p % 2][0];
    int32_t* vo = buf[p % 2][1];
    cudak::launch(radix_count_kernel, static_cast<unsigned>(tiles), kSortThreads, 0, stream, counts,
                  keys, n, 8 * p, tiles);
    ST_CUDA_CHECK_LAUNCH("radix_count_kernel");
    cudak::launch(exclusive_scan_kernel, 1u, kScanThreads, 0, stream, counts, 256 * tiles);
    ST_CUDA_CHECK_LAUNCH("exclusive_scan_kernel");
    cudak::launch(radix_scatter_kernel, static_cast<unsigned>(tiles), kSortThreads, 0, stream, ko,
                  vo, keys, vals, counts, n, 8 * p, tiles);
    ST_CUDA_CHECK_LAUNCH("radix_scatter_kernel");
    keys = ko;
    vals = vo;
  }
  constexpr int kWarpsPerBlock = kChannelThreads / 32;
  const unsigned gblocks =
      static_cast<unsigned>(std::min((n + kWarpsPerBlock - 1) / kWarpsPerBlock, kGroupBlocks));
  dispatch_storage(dtype, "encoder_backward", [&](auto tag) {
    using T_ = typename decltype(tag)::type;
    constexpr int W = kWide<T_>;
    auto* wte = static_cast<T_*>(dwte);
    auto* wpe = static_cast<T_*>(dwpe);
    const auto* d = static_cast<const T_*>(dout);
    const bool wide = C % W == 0 && aligned16(dwte) && aligned16(dwpe) && aligned16(dout);
    if (wide) {
      cudak::launch(encoder_dwte_kernel<T_, W>, gblocks, kChannelThreads, 0, stream, wte, d, keys,
                    vals, n, C);
    } else {
      cudak::launch(encoder_dwte_kernel<T_, 1>, gblocks, kChannelThreads, 0, stream, wte, d, keys,
                    vals, n, C);
    }
    ST_CUDA_CHECK_LAUNCH("encoder_dwte_kernel");
    const int V = wide ? W : 1;
    const unsigned vtiles =
        static_cast<unsigned>((C / V + kChannelThreads - 1) / kChannelThreads);
    if (wide) {
      cudak::launch(encoder_dwpe_kernel<T_, W>, dim3(static_cast<unsigned>(T), vtiles),
                    kChannelThreads, 0, stream, wpe, d, B, T, C);
    } else {
      cudak::launch(encoder_dwpe_kernel<T_, 1>, dim3(static_cast<unsigned>(T), vtiles),
                    kChannelThreads, 0, stream, wpe, d, B, T, C);
    }
    ST_CUDA_CHECK_LAUNCH("encoder_dwpe_kernel");
  });
}

}  // namespace st::cudak
