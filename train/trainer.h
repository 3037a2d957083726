// The training driver behind `train`: run directory, step loop, evaluation, metrics,
// checkpoints and exact resume. Library code (throws st::Error); apps/train.cpp is the CLI.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt2.h"
#include "train/config.h"

namespace st {

struct TrainOptions {
  bool resume = false;      // continue from the newest checkpoint in run.out_dir
  bool overwrite = false;   // delete an existing run directory first
  int64_t stop_after = -1;  // stop (with a checkpoint) after this many steps in total
  bool console = true;      // progress lines on stdout (train.log is always written)
};

struct TrainResult {
  int64_t first_step = 0;          // step the run started (or resumed) from
  int64_t last_step = 0;           // steps completed
  std::vector<float> losses;       // training loss of each step run by this call
  std::string weights_sha256;      // of the master weights at the end
  double val_loss = 0.0;           // last evaluation
  double tokens_per_s = 0.0;       // mean over this call's steps
  std::string sample;              // text sample at the end (if enabled)
  double hook_seconds = 0.0;       // wall time spent in the stability hooks
  // Data parallelism (dist.*; docs/distributed.md): this process's place in the job, the
  // optimizer-state bytes it allocated (m, v and a separate master: ZeRO-1 shards them) and
  // its resident set: the largest right after an update, and the peak (VmHWM).
  int rank = 0, world = 1;
  size_t optimizer_bytes = 0;
  size_t step_rss_bytes = 0;
  size_t peak_rss_bytes = 0;
  double comm_seconds = 0.0;  // in collectives of the training steps (waiting included)
  // SIGINT or SIGTERM stopped the run after last_step (with a checkpoint); 0 otherwise.
  int stop_signal = 0;
  // --resume found the run at train.max_steps (or at --stop-after): no step was run and no
  // file of the run directory was touched; `nothing_to_do` is the line printed.
  std::string nothing_to_do;
};

// Under a launcher (mpirun, srun) with dist.backend mpi / nccl / auto this is one rank of a
// data-parallel job (docs/distributed.md): every rank calls it; rank 0 writes the logs,
// metrics and model file. There an error on any rank ends every rank (message on stderr,
// MPI_Abort) instead of throwing; a single process throws st::Error as always.
TrainResult run_training(const Config& cfg, const TrainOptions& opt);

// Checkpoint file name for a step, and the newest checkpoint in a directory ("" if none).
// ZeRO-1 runs add one optimizer shard per rank, rank_checkpoint_name(step, rank); the main
// file is written last, so a checkpoint without it is incomplete and never resumed from.
std::string checkpoint_name(int64_t step);
std::string rank_checkpoint_name(int64_t step, int rank);
std::string latest_checkpoint(const std::string& dir);
// Every main checkpoint file of a directory as (step, path), oldest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

}  // namespace st
