// Running kernels in the SIMT emulator for the cost tools (simt_cost_model.cpp,
// simt_attention_cost.cpp): device memory as lazily-zeroed pages, a traced launch, and the
// tools' main.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "simt/simt.h"

namespace st::cost {

// Device memory under the emulator: zero pages from mmap, so that a gigabyte the sampled
// blocks never touch costs nothing.
struct Mem {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Mem(size_t b) : bytes(std::max<size_t>(b, 4096)) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of " + std::to_string(bytes) + " bytes failed");
  }
  ~Mem() { munmap(p, bytes); }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Runs `launch` in the emulator with traffic counting on max_blocks blocks of each grid (0:
// all); returns the launches it made; throws when one fails the emulator's checks.
inline std::vector<simt::LaunchTraffic> traced(uint64_t max_blocks,
                                               const std::function<void()>& launch) {
  auto& log = simt::traffic_log();
  log.clear();
  simt::options().count_traffic = true;
  simt::options().max_blocks = max_blocks;
  const uint64_t fails = simt::failures();
  launch();
  simt::options().count_traffic = false;
  simt::options().max_blocks = 0;
  if (simt::failures() != fails || cudaGetLastError() != cudaSuccess)
    throw std::runtime_error("a launch failed: " + simt::last_failure());
  return log;
}

// A cost tool's main: run(argc, argv), or, when it throws, the message after the tool's name
// on stderr and exit status 1.
inline int tool_main(const char* tool, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return 1;
  }
}

}  // namespace st::cost
