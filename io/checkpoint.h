// Checkpoints: the full training state, written atomically (temporary file in the same
// directory, fsync, rename, fsync of the directory) so a crash never leaves a half file
// under the final name. Versioned binary format with a SHA-256 over the whole payload;
// reading refuses a wrong magic, an unknown version, a truncated file or a checksum
// mismatch with an error naming the file. The file format is documented at the top of
// checkpoint.cpp, the checks of the values read at the top of checkpoint_check.cpp.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace st {

struct GPT2Config;  // model/gpt2.h

inline constexpr char kCheckpointMagic[9] = "STCKPT01";  // first 8 bytes of every file
inline constexpr uint32_t kCheckpointVersion = 3;        // written; versions 1..3 are read
// Checkpoint names hold the step in 8 digits (ckpt_NNNNNNNN.bin): the largest step a run
// can checkpoint, and so train.max_steps's bound.
inline constexpr int64_t kMaxCheckpointStep = 99999999;

struct CheckpointState {
  // Identity of the run, checked on resume.
  std::string config_yaml;  // resolved config the run was started with
  int64_t step = 0;         // optimizer steps completed
  int64_t adam_step = 0;
  // Model shape and precision (for a clear error when they do not match on resume).
  int32_t n_layer = 0, n_head = 0, n_embd = 0, max_seq_len = 0, vocab_size = 0,
          padded_vocab_size = 0;
  std::string compute;  // precision.compute
  // Optimizer state: FP32 (FP64 in the fp64 reference mode: stored as raw bytes with the
  // element size recorded).
  int32_t master_elem_bytes = 4;
  // Raw little-endian arrays of num_params elements: equal sizes, a multiple of
  // master_elem_bytes (4 or 8). save and load both refuse anything else.
  std::vector<uint8_t> master, m, v;
  // Loss scaler.
  float loss_scale = 1.0f;
  int32_t loss_scale_good_steps = 0;
  // RNG and data position, serialised field by field by their modules
  // (Rng::State::to_bytes, DataLoader::State::to_bytes; never raw structs, whose padding
  // would make the file depend on uninitialised memory).
  std::vector<uint8_t> rng_state;
  std::vector<uint8_t> data_state;
  // Wall time of the run so far, as recorded by versions 1..2 (read back from them). Not
  // written since version 3 (it made two identical runs' checkpoints differ): it stays 0
  // when reading a version-3 file, and the trainer keeps wall time in the checkpoint
  // record of metrics.jsonl instead.
  double elapsed_s = 0.0;
  // Stability-hook state (train/hooks.h: power-iteration vectors, delta-drift sums, spike
  // detector window), so a resumed run's diagnostics continue exactly. Empty in version 1.
  std::vector<uint8_t> hooks_state;
  // Data-parallel runs (docs/distributed.md). Written only when they differ from these
  // defaults, so a single-process checkpoint has none of these records.
  int32_t dist_world = 1;    // ranks of the run that wrote the checkpoint
  // 0: master, m and v are the whole optimizer state. N > 0 (ZeRO-1 over N ranks): the main
  // file ckpt_NNNNNNNN.bin holds the whole master weights and empty m and v; rank r's file
  // ckpt_NNNNNNNN.rank<r>.bin holds master, m and v of its shard [shard_begin, shard_end).
  int32_t optim_shards = 0;
  int32_t shard_rank = -1;   // rank files: whose shard; -1 in a main file
  int64_t shard_begin = 0, shard_end = 0;  // rank files: elements of the flat parameters
};

// Writes atomically to `path`; returns the hex SHA-256 of the master weights bytes. On
// failure throws st::Error and leaves any existing file at `path` untouched.
std::string save_checkpoint(const std::string& path, const CheckpointState& s);
// Throws st::Error naming `path` on any defect (missing, truncated, wrong magic, unknown
// version, checksum mismatch, bad records); never returns altered data.
CheckpointState load_checkpoint(const std::string& path);
// The model shape of the shape records (n_layer ... padded_vocab_size), unchecked
// (load_checkpoint has checked it; GPT2Config::validate for a state built in code).
GPT2Config model_config(const CheckpointState& s);
// The inverse: the shape records from a model's shape, padded_vocab_size = c.vp() (what a
// checkpoint of that model holds).
void set_model_config(CheckpointState& s, const GPT2Config& c);
// SHA-256 of a byte range, lowercase hex.
std::string sha256_hex(const void* data, size_t n);

}  // namespace st
