// DeviceArena (see arena.h): chunked reservation, best-fit free list, bump allocation.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda/arena.h"
#include "cuda/cuda_check.h"

namespace st {
namespace {
constexpr size_t kMaxChunkBytes = size_t{1} << 30;
constexpr size_t kChunkGranularity = size_t{2} << 20;
size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}
}  // namespace

DeviceArena::DeviceArena(int device_index) : device_index_(device_index) {}

DeviceArena::~DeviceArena() {
  // The chunks go back to the driver; at process exit the runtime may already be gone.
  int prev = -1;
  const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
  if (have_prev && prev != device_index_) (void)cudaSetDevice(device_index_);
  for (void* c : chunks_) {
    const cudaError_t e = cudaFree(c);
    if (e != cudaErrorCudartUnloading)
      cuda_detail::check_nothrow(e, "cudaFree(chunk)", __FILE__, __LINE__);
  }
  if (have_prev && prev != device_index_) (void)cudaSetDevice(prev);
}

void* DeviceArena::reserve_chunk(size_t min_bytes) {
  size_t bytes = round_up(std::max(min_bytes, next_chunk_bytes_), kChunkGranularity);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  const size_t tight = round_up(min_bytes, kChunkGranularity);
  if (e == cudaErrorMemoryAllocation && tight < bytes) {
    // Near the device's limit the grown chunk may not fit where the request itself does.
    (void)cudaGetLastError();
    bytes = tight;
    e = cudaMalloc(&p, bytes);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail("CUDA backend: out of device memory reserving a chunk of ", bytes,
         " bytes for a request of ", min_bytes, " bytes (arena: ", stats_.reserved_bytes,
         " bytes reserved in ", chunks_.size(), " chunks, ", stats_.in_use_bytes,
         " in use): cudaMalloc: ", cudaGetErrorString(e));
  }
  chunks_.push_back(p);
  ++stats_.cuda_malloc_calls;
  stats_.reserved_bytes += bytes;
  if (bytes == round_up(next_chunk_bytes_, kChunkGranularity))
    next_chunk_bytes_ = std::min(kMaxChunkBytes, next_chunk_bytes_ * 2);
  // The unused tail of the current chunk becomes a free block; the new chunk is bumped next.
  if (bump_left_ >= kAlign) free_.emplace(bump_left_, bump_);
  bump_ = static_cast<char*>(p);
  bump_left_ = bytes;
  return p;
}

void* DeviceArena::allocate(size_t bytes) {
  ST_CHECK(bytes > 0, "DeviceArena::allocate of 0 bytes");
  const size_t need = round_up(bytes, kAlign);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  size_t got = need;
  auto it = free_.lower_bound(need);
  if (it != free_.end() && it->first / 2 <= need) {
    p = it->second;
    got = it->first;
    free_.erase(it);
    ++stats_.reused;
  } else {
    if (bump_left_ < need) reserve_chunk(need);
    p = bump_;
    bump_ += need;
    bump_left_ -= need;
  }
  live_.emplace(p, got);
  ++stats_.allocations;
  stats_.in_use_bytes += got;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return p;
}

void DeviceArena::release(void* p) noexcept {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    std::fprintf(stderr, "warning: DeviceArena::release of a pointer it did not hand out\n");
    return;
  }
  stats_.in_use_bytes -= it->second;
  try {
    free_.emplace(it->second, p);
  } catch (...) {  // out of host memory: the block is lost until the arena goes
  }
  live_.erase(it);
}

ArenaStats DeviceArena::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DeviceArena::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

}  // namespace st
