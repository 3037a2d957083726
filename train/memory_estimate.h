// The trainer's start-up memory estimate (train/memory_estimate.cpp): what one rank of a
// run will hold at its peak, item by item, computed before the model is allocated from
// the model's own allocation list (model_memory / activation_specs in model/gpt2.h), and
// the memory the machine has for it. Run::build refuses a CPU run whose estimate exceeds
// the available memory before anything is allocated or written (docs/run_files.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "model/gpt2.h"
#include "train/config.h"

namespace st {

struct MemoryItem {
  std::string name;
  int64_t bytes = 0;
};

struct MemoryEstimate {
  std::vector<MemoryItem> resident;   // held for the whole run
  std::vector<MemoryItem> transient;  // short-lived buffers; the largest counts (peak)
  int64_t activations = 0;            // of the resident: the micro-batch's activations
  int64_t attention_saved = 0;        // of the resident: the CPU attention's saved state
  int64_t resident_bytes() const;
  int64_t peak_transient_bytes() const;
  const MemoryItem* peak_transient() const;  // null when there are none
  int64_t total() const { return resident_bytes() + peak_transient_bytes(); }
  // One line: "memory estimate: 2.79 GiB = parameters 475.0 MiB + ... + largest transient
  // (checkpoint write) 1.39 GiB".
  std::string line() const;
};

// The estimate for one rank of `cfg` on `be` (shard_numel: the ZeRO-1 optimizer shard,
// < 0: all parameters). threads: the CPU threads the attention and OpenBLAS use.
MemoryEstimate estimate_memory(const Config& cfg, const GPT2Config& mc, const Backend& be,
                               int64_t shard_numel, int threads);

// Bytes the CPU attention of every layer keeps from forward to backward for a B x T
// micro-batch (the baseline's T x T probabilities per sequence and head dominate at T = 1024).
int64_t cpu_attention_saved_bytes(const Config& cfg, const GPT2Config& mc, int B, int T);

// The memory this process may use: the cgroup's limit less its usage when a limit is set
// (cgroup v2 memory.max, v1 memory.limit_in_bytes), else /proc/meminfo MemAvailable.
// bytes < 0 when neither can be read.
struct AvailableMemory {
  int64_t bytes = -1;
  std::string source;  // "MemAvailable" or "cgroup memory.max - memory.current", ...
};
AvailableMemory available_memory();

// The one-line refusal when the estimate exceeds the available memory (empty if it fits
// or the available memory is unknown).
std::string memory_refusal(const MemoryEstimate& e, const AvailableMemory& avail,
                           const Config& cfg);

std::string format_bytes(int64_t bytes);  // "512 B", "12.3 MiB", "2.79 GiB"

}  // namespace st
