// dist_memory: bytes per rank of a model's parameters, gradients and optimizer state (AdamW
// m and v, plus FP32 master weights in bf16/fp16) with and without ZeRO-1, for N ranks
// (docs/distributed.md). The figures are read from real allocations: for every (precision,
// N, ZeRO) it builds the model as rank 0 of the job would (GPT2 with the trainer's
// OptimShard: rank 0 holds the largest part) on the CPU backend and sums the tensors' sizes.
// GPU storage would hold bf16/fp16 parameters and gradients in 2 bytes; the CPU keeps them in
// FP32 storage, so for bf16 both are given.
//
//   dist_memory [--config configs/gpt2_small.yaml] [--ranks 1,2,8] [--precisions fp32,bf16]
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "backends/backends.h"
#include "core/backend.h"
#include "core/error.h"
#include "data/excerpt.h"
#include "dist/comm.h"
#include "model/gpt2.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(x);
  return v;
}

double mib(double b) { return b / 1048576.0; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dist_memory: per-rank parameter, gradient and optimizer bytes with and without ZeRO-1"};
  std::string config = "configs/gpt2_small.yaml", ranks = "1,2,8", precisions = "fp32,bf16";
  app.add_option("--config", config, "config whose model section is measured");
  app.add_option("--ranks", ranks, "comma-separated rank counts");
  app.add_option("--precisions", precisions, "comma-separated precision.compute values");
  CLI11_PARSE(app, argc, argv);
  try {
    const st::Config cfg = st::load_config(config, {"device=cpu"});
    const st::GPT2Config mc = st::model_config(cfg);
    auto be = st::make_cpu_backend(1);
    const int64_t P = st::num_parameters(mc);
    std::printf("model %s: L=%d H=%d C=%d maxT=%d V=%d (padded %d): %lld parameters\n\n",
                config.c_str(), mc.n_layer, mc.n_head, mc.n_embd, mc.max_seq_len, mc.vocab_size,
                mc.vp(), static_cast<long long>(P));
    std::printf("| precision | ranks N | ZeRO-1 | optimizer state / rank (largest) | of which "
                "master | m + v | params + grads / rank (CPU storage) | params + grads "
                "(GPU storage) | total / rank (GPU storage) |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& prec : split(precisions)) {
      const st::DType compute = st::parse_dtype(prec);
      const double low = (compute == st::DType::BF16 || compute == st::DType::F16) ? 2 : 4;
      for (const std::string& rs : split(ranks)) {
        int N = 0;  // whole field (std::stoi took "2x" as 2 and threw "stoi" on "x")
        const auto [end, ec] = std::from_chars(rs.data(), rs.data() + rs.size(), N);
        if (rs.empty() || ec != std::errc() || end != rs.data() + rs.size() || N < 1)
          st::fail("--ranks: expected rank counts >= 1, got '", st::excerpt(rs), "'");
        for (int zero = 0; zero <= 1; ++zero) {
          if (N == 1 && zero) continue;
          st::OptimShard shard;
          if (zero) {
            const st::Partition p(P, N, st::kSumSquaresChunk);
            shard = {p.begin(0), p.end(0)};
          }
          st::GPT2 m(mc, *be, compute, st::AttentionConfig{}, {}, shard);
          const double opt = static_cast<double>(m.optimizer_bytes());
          const double master = m.separate_master() ? m.master_flat().nbytes() : 0.0;
          const double pg = static_cast<double>(m.params_flat().nbytes() + m.grads_flat().nbytes());
          const double pg_gpu = 2.0 * low * static_cast<double>(P);
          std::printf("| %s | %d | %s | %.1f MiB (%.0f B) | %.1f MiB | %.1f MiB | %.1f MiB | "
                      "%.1f MiB | %.1f MiB |\n",
                      prec.c_str(), N, zero ? "yes" : "no", mib(opt), opt, mib(master),
                      mib(opt - master), mib(pg), mib(pg_gpu), mib(opt + pg_gpu));
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_memory: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
