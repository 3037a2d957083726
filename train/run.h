// The trainer's internals, shared by its three files and included by nothing else:
//   train/trainer.cpp          run_training; setting up ranks, backend, data, model, the run
//                              directory and its logs; error handling across ranks
//   train/run_checkpoints.cpp  writing checkpoints (ZeRO-1 shards), rotation, exact resume
//   train/step_loop.cpp        the step loop, evaluation, sampling and metrics.jsonl
// One Run object is one invocation of run_training.
#pragma once
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "io/checkpoint.h"
#include "model/gpt2.h"
#include "train/hooks.h"
#include "train/memory_estimate.h"
#include "train/run_io.h"
#include "train/trainer.h"

namespace st::detail {

// metrics.jsonl's record of a config key a resume changed (docs/run_files.md).
inline constexpr const char* kConfigChangeKind = "config_change";

// "section.key" -> value of a YAML document's text: flatten_yaml (train/config.h) of its one
// document; throws st::Error on more documents or YAML it cannot flatten (config comparison
// on resume and between ranks; train/run_checkpoints.cpp).
std::map<std::string, std::string> flatten(const std::string& yaml);

// STABLETRAIN_FAULT (train/trainer.cpp): dies, hangs or throws at a named point when set.
void inject_fault(int rank, int64_t step, const char* where);

class Run {
 public:
  Run(const Config& cfg, const TrainOptions& opt) : cfg_(cfg), opt_(opt) {}
  TrainResult go();
  // Error handling of run_training: a single process rethrows; a rank of a data-parallel
  // job reports and ends every rank.
  bool distributed() const { return comm_ && comm_->world() > 1; }
  [[noreturn]] void abort_all(const std::exception& e);
  // After a failed write: how to go on from the checkpoints on disk (resume from the last,
  // or start again when none was written).
  std::string after_write_error() const {
    if (last_ckpt_step_ >= 0)
      return " (free space, then --resume: it continues from " + last_ckpt_ + ")";
    return " (no checkpoint was written yet: free space, then start again with --overwrite)";
  }
  void finalize_quietly() {
    if (comm_) comm_->finalize();
  }

 private:
  bool lead() const { return rank_ == 0; }
  void setup_dist();
  void prepare_dir();
  // --resume of a run with no step left to run: the line that says so, else "".
  std::string nothing_to_do();
  void open_logs();
  void build();
  // Runs f on rank 0; an error there ends every rank with rank 0's message.
  void on_lead(const std::function<void()>& f);
  // Every rank knows the same error: rank 0 reports it, then every rank stops.
  [[noreturn]] void collective_fail(const std::string& msg);
  std::string share_string(std::string s);  // rank 0's value on every rank
  void restore(const std::string& path);
  void check_records(const CheckpointState& s, const std::string& path) const;
  // metrics.jsonl records of the config keys a resume changed (restore collects them).
  void write_config_changes();
  std::string save(int64_t step, double elapsed_s);
  // The state before step `step`'s update, with the loader where it stood before the step.
  void save_spike_snapshot(int64_t step, double elapsed_s, const DataLoader::State& ds);
  // Writes the checkpoint `name` (and, with ZeRO-1, every rank's shard beside it); collective.
  // Returns the master weights' SHA-256 on every rank.
  std::string write_checkpoint(const std::string& name, int64_t step, double elapsed_s,
                               const DataLoader::State& ds);
  CheckpointState checkpoint_state(int64_t step, double elapsed_s) const;  // without master
  // The whole master weights as raw bytes (gathered across ranks under ZeRO-1 with a
  // separate master; collective then); every rank gets them.
  std::vector<uint8_t> whole_master_bytes();
  void load_whole_master(const std::vector<uint8_t>& bytes, const std::string& path);
  void refresh_master_cache();  // ZeRO-1, bf16/fp16: rank 0's hooks read master_fp32()
  bool master_is_sharded() const { return model_->sharded() && model_->separate_master(); }
  double grad_sum_squares_global();
  std::string memory_line() const;  // the estimate and the available memory, one line
  void remove_checkpoint(int64_t step, const std::string& main_path);
  void remove_orphans();
  double evaluate();
  std::string sample();
  void write_metrics(const nlohmann::ordered_json& j);

  Config cfg_;
  TrainOptions opt_;
  std::string dir_, resume_from_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0, world_ = 1;
  bool zero_ = false;  // ZeRO-1 over world_ > 1 ranks
  Partition shard_;    // ZeRO-1: each rank's part of the flat parameters
  std::string threads_note_;
  int max_threads_ = 0;  // run.threads auto: the most threads to try (0: every core)
  std::unique_ptr<Backend> be_;
  std::unique_ptr<GPT2> model_;
  std::unique_ptr<StabilityHooks> hooks_;
  TokenData data_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;
  std::unique_ptr<Gpt2Tokenizer> tokenizer_;  // gpt2 data: decodes the sample
  std::vector<std::string> data_notes_;        // data preparation lines, logged once open
  Rng rng_;
  int64_t step_ = 0;
  double elapsed_prev_ = 0;  // seconds from earlier invocations (resume)
  LogFile metrics_;
  std::unique_ptr<RunDirLock> lock_;  // rank 0: held from prepare_dir to the end
  std::string log_error_;             // the first failed write to train.log
  std::string last_ckpt_ = "(none)";
  int64_t last_ckpt_step_ = -1;
  std::vector<float> master_cache_;
  struct ConfigChange {
    std::string key, from, to;
  };
  std::vector<ConfigChange> config_changes_;  // keys this resume changed (restore)
  MemoryEstimate memory_;      // CPU runs: the start-up estimate (train/memory_estimate.h)
  AvailableMemory available_;
};

}  // namespace st::detail
