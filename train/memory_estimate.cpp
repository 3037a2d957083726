// The start-up memory estimate (train/memory_estimate.h). The model's part comes from
// model_memory (model/gpt2.h), the list GPT2 allocates from; the rest are the buffers the
// trainer, hooks and checkpoint writer allocate for a moment, sized here from the same
// parameter count. Measured against peak RSS in docs/run_files.md ("Memory estimate").
#include "train/memory_estimate.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "attention/head_fast.h"

namespace st {

namespace {

// The process before any model buffer: the binary, its libraries, OpenMP and OpenBLAS
// threads and buffers (measured: 28 MiB peak RSS for the 0.5M-parameter fingerprint run
// on 2 threads, tests/data/fingerprint.yaml), and the GPT-2 tokenizer the text sample
// loads (measured: ~40 MiB more resident with train.sample_tokens > 0; docs/run_files.md).
constexpr int64_t kRuntimeBase = int64_t(20) << 20;
constexpr int64_t kRuntimePerThread = int64_t(4) << 20;
constexpr int64_t kGpt2Tokenizer = int64_t(40) << 20;

int64_t read_int(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  try {
    return std::stoll(s);
  } catch (...) {
    return -1;
  }
}

}  // namespace

int64_t cpu_attention_saved_bytes(const Config& cfg, const GPT2Config& mc, int B, int T) {
  // What the CPU attention keeps per layer from forward to backward, per sequence and head:
  // O and O before its last rounding (2 x T x head_size), lse (T), and for the baseline the
  // materialised P (T x T). The lab (attention/head_cpu.h HeadForward) holds them in FP64;
  // the fast path (attention/head_fast.h) in FP32, and O before its rounding only for the
  // delta modes that read it. A run whose hooks collect attention statistics runs the lab
  // on hook steps (its buffers replace the fast path's), so the lab's size is its peak.
  const std::vector<AttentionConfig> ac = attention_configs(cfg);
  const DType compute = compute_format(cfg);
  const bool lab_steps = cfg.hooks.every > 0 && cfg.hooks.attn_stats;
  const int64_t hs = mc.n_embd / mc.n_head, heads = int64_t(B) * mc.n_head;
  int64_t n = 0;
  for (int l = 0; l < mc.n_layer; ++l) {
    const AttentionConfig& a = ac[ac.size() == 1 ? 0 : l];
    const HeadFastLayer fl = head_fast_layer(a, compute, mc.n_head);
    const int64_t P = a.kind == AttentionKind::Baseline ? int64_t(T) * T : 0;
    n += fl.eligible && !lab_steps
             ? heads * ((fl.keeps_o32 ? 2 : 1) * int64_t(T) * hs + T + P) * 4
             : heads * (2 * int64_t(T) * hs + T + P) * 8;
  }
  return n;
}

int64_t MemoryEstimate::resident_bytes() const {
  int64_t n = 0;
  for (const MemoryItem& i : resident) n += i.bytes;
  return n;
}

const MemoryItem* MemoryEstimate::peak_transient() const {
  const MemoryItem* best = nullptr;
  for (const MemoryItem& i : transient)
    if (!best || i.bytes > best->bytes) best = &i;
  return best;
}

int64_t MemoryEstimate::peak_transient_bytes() const {
  const MemoryItem* p = peak_transient();
  return p ? p->bytes : 0;
}

std::string format_bytes(int64_t b) {
  char buf[64];
  if (b < 1024)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < (int64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

std::string MemoryEstimate::line() const {
  std::string s = "memory estimate: " + format_bytes(total()) + " =";
  bool first = true;
  for (const MemoryItem& i : resident) {
    if (i.bytes == 0) continue;
    s += std::string(first ? " " : " + ") + i.name + " " + format_bytes(i.bytes);
    first = false;
  }
  if (const MemoryItem* p = peak_transient())
    s += " + largest transient (" + p->name + ") " + format_bytes(p->bytes);
  return s;
}

MemoryEstimate estimate_memory(const Config& cfg, const GPT2Config& model_cfg, const Backend& be,
                               int64_t shard_numel, int threads) {
  GPT2Config mc = model_cfg;
  mc.padded_vocab_size = mc.vp();
  const int B = cfg.train.batch_size, T = cfg.train.seq_len;
  const DType compute = compute_format(cfg);
  const bool separate = grad_accum_mode(cfg) == GradAccumMode::kSeparate &&
                        cfg.train.grad_accum_steps > 1;
  const ModelMemory m =
      model_memory(mc, be, compute, B, T, recompute_mode(cfg), separate, shard_numel);
  const int64_t n = num_parameters(mc);
  const int64_t C = mc.n_embd, hs = C / mc.n_head;
  if (threads <= 0) threads = omp_get_max_threads();
  threads = std::max(1, threads);
  MemoryEstimate e;
  e.activations = m.activations;
  e.attention_saved = be.device() == Device::CPU ? cpu_attention_saved_bytes(cfg, mc, B, T) : 0;
  e.resident = {{"parameters", m.params},
                {"gradients", m.grads},
                {"FP32 master weights", m.master},
                {"AdamW m and v", m.adam_mv},
                {"gradient scratch (grad_accum_mode separate)", m.grad_scratch},
                {"activations (" + std::to_string(B) + " x " + std::to_string(T) + ")",
                 m.activations},
                {"attention saved for backward", e.attention_saved},
                // The CPU attention's per-thread FP64 head buffers (q, k, v, dO, dq, dk, dv
                // and a row of scores): a few T x head_size arrays per thread.
                {"attention scratch", be.device() == Device::CPU
                                          ? int64_t(threads) * (8 * T * hs + 4 * T) * 8
                                          : 0},
                {"runtime", kRuntimeBase + int64_t(threads) * kRuntimePerThread},
                {"GPT-2 tokenizer (text sample)",
                 cfg.data.tokenizer == "gpt2" && cfg.train.sample_tokens > 0 ? kGpt2Tokenizer
                                                                            : 0}};
  // Transient buffers, each alive on its own (the largest counts).
  const int64_t master_b = compute == DType::F64 ? 8 : 4;
  const int64_t ns = shard_numel < 0 ? n : shard_numel;
  // init_weights: the FP32 flat array and the host tensor it is copied into.
  e.transient.push_back({"weight init", 2 * n * 4});
  // A checkpoint: m, v and the whole master as bytes, plus one host copy being made.
  e.transient.push_back({"checkpoint write", 2 * ns * master_b + n * master_b + n * master_b});
  if (cfg.hooks.every > 0) {
    if (cfg.hooks.spectral)  // master_fp32(): host tensor + vector
      e.transient.push_back({"hooks: spectral norms", 2 * n * 4});
    if (cfg.hooks.grad_norms)  // the gradients as FP64 on the host
      e.transient.push_back({"hooks: gradient norms", n * 8});
    if (cfg.hooks.delta_drift)  // one layer's qkv, dout, ln1 as FP64 on the host
      e.transient.push_back({"hooks: delta drift", int64_t(B) * T * 5 * C * 8});
  }
  if (cfg.train.sample_tokens > 0) {  // the sample's (1, t) activations beside the training ones
    const int t = std::min(T, mc.max_seq_len);
    e.transient.push_back(
        {"text sample", model_memory(mc, be, compute, 1, t, recompute_mode(cfg), false)
                            .activations});
  }
  return e;
}

AvailableMemory available_memory() {
  AvailableMemory a;
  // cgroup v2, then v1: the limit less what the group already uses.
  const int64_t max2 = read_int("/sys/fs/cgroup/memory.max");
  if (max2 > 0) {
    const int64_t cur = std::max<int64_t>(0, read_int("/sys/fs/cgroup/memory.current"));
    a.bytes = std::max<int64_t>(0, max2 - cur);
    a.source = "cgroup memory.max - memory.current";
  } else {
    const int64_t max1 = read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (max1 > 0 && max1 < (int64_t(1) << 60)) {
      const int64_t cur =
          std::max<int64_t>(0, read_int("/sys/fs/cgroup/memory/memory.usage_in_bytes"));
      a.bytes = std::max<int64_t>(0, max1 - cur);
      a.source = "cgroup memory.limit_in_bytes - usage";
    }
  }
  std::ifstream f("/proc/meminfo");
  for (std::string key; f >> key;) {
    long long kb = 0;
    f >> kb;
    if (key == "MemAvailable:") {
      const int64_t avail = static_cast<int64_t>(kb) * 1024;
      if (a.bytes < 0 || avail < a.bytes) {
        a.bytes = avail;
        a.source = "MemAvailable";
      }
      break;
    }
    std::string unit;
    std::getline(f, unit);
  }
  return a;
}

std::string memory_refusal(const MemoryEstimate& e, const AvailableMemory& avail,
                           const Config& cfg) {
  if (avail.bytes < 0 || e.total() <= avail.bytes) return "";
  const TrainSection& t = cfg.train;
  bool baseline_attention = false;
  for (const AttentionConfig& a : attention_configs(cfg))
    baseline_attention |= a.kind == AttentionKind::Baseline;
  return cfg.source + ": the run needs about " + format_bytes(e.total()) +
         " of memory (for train.batch_size " + std::to_string(t.batch_size) +
         " x train.seq_len " + std::to_string(t.seq_len) + ": activations " +
         format_bytes(e.activations) +
         (e.attention_saved > 0 ? ", attention state " + format_bytes(e.attention_saved) : "") +
         "), more than the " +
         format_bytes(avail.bytes) + " available (" + avail.source +
         "); lower train.batch_size or train.seq_len and raise train.grad_accum_steps to keep "
         "the tokens per step (now " +
         std::to_string(static_cast<int64_t>(t.batch_size) * t.seq_len * t.grad_accum_steps) +
         "), or set train.recompute" +
         (baseline_attention ? "; attention.backend flash keeps no T x T probabilities" : "");
}

}  // namespace st
