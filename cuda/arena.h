// DeviceArena: the CUDA backend's device memory. Parameters, gradients, optimizer state,
// activations and per-call scratch all come from it, so a training step (whose tensors are
// planned once, then freed and re-requested with the same sizes) makes no cudaMalloc call.
//
// How it works:
//  - Memory is reserved from the driver in large chunks (cudaMalloc, 64 MiB at first, each
//    new chunk twice the last up to 1 GiB; a request larger than that gets a chunk of its
//    own). Chunks are returned only when the arena is destroyed.
//  - A request (rounded up to 256 bytes, so every block is 256-byte aligned) is served
//    first from the free list: the smallest free block of at least the request and at most
//    twice it (best fit, never split). Otherwise it is bumped off the current chunk; when
//    that has too little left, the rest of the chunk goes to the free list and a new chunk
//    is reserved.
//  - A released block goes straight back to the free list and may be handed out again at
//    once, while kernels queued before the release may still be using it. That is safe
//    because every kernel and copy of the backend runs in order on its one stream (the
//    same rule as PyTorch's caching allocator): the next user's work is queued after them.
//    Memory from the arena must therefore not be used on another stream.
//  - The arena is shared (shared_ptr) by the backend and the deleter of every Storage it
//    handed out, so a tensor that outlives its backend still frees safely.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace st {

struct ArenaStats {
  int64_t cuda_malloc_calls = 0;  // chunks reserved from the driver so far
  size_t reserved_bytes = 0;      // sum of chunk sizes
  size_t in_use_bytes = 0;        // blocks handed out and not yet released (rounded sizes)
  size_t peak_in_use_bytes = 0;
  int64_t allocations = 0;  // allocate() calls served
  int64_t reused = 0;       // of which from the free list
};

class DeviceArena {
 public:
  explicit DeviceArena(int device_index);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // A 256-byte-aligned block of at least `bytes` (> 0). Throws st::Error naming the size and
  // the arena's state when the device is out of memory.
  void* allocate(size_t bytes);
  void release(void* p) noexcept;
  ArenaStats stats() const;
  void reset_peak();  // peak_in_use_bytes = in_use_bytes

  static constexpr size_t kAlign = 256;

 private:
  void* reserve_chunk(size_t min_bytes);  // called with mu_ held

  int device_index_;
  mutable std::mutex mu_;
  std::vector<void*> chunks_;
  char* bump_ = nullptr;  // next free byte of the current chunk
  size_t bump_left_ = 0;
  size_t next_chunk_bytes_ = size_t{64} << 20;
  std::multimap<size_t, void*> free_;       // size -> block
  std::unordered_map<void*, size_t> live_;  // block -> size
  ArenaStats stats_;
};

}  // namespace st
