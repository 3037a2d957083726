// Deterministic batch loader over a TokenSet (one or more token spans, e.g. shards).
// Each span is cut into windows of T+1 tokens starting at multiples of T (windows never
// cross spans); windows are numbered across spans in order. Each epoch visits every window
// once in an order that is a permutation drawn from (seed, epoch) alone; the epochs one after
// another form one stream of windows, cut into micro-batches of B (a micro-batch may span
// the end of one epoch and the start of the next).
// Data parallelism: rank r of `world` serves micro-batches r, r + world, r + 2 world, ... of
// that stream, so `world` ranks with one micro-batch each see together exactly the
// micro-batches one process sees with grad_accum_steps = world, in the same order. The
// position (epoch, index) of the next group of `world` micro-batches is the whole state,
// the same on every rank: it goes into checkpoints, so a resumed run sees exactly the
// batches an uninterrupted run would.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace st {

class DataLoader {
 public:
  // shuffle = false serves windows in order (evaluation). The set must outlive the loader.
  DataLoader(const TokenSet& tokens, int B, int T, uint64_t seed, bool shuffle, int rank = 0,
             int world = 1);
  // Fills inputs and targets, B*T each (targets are inputs shifted by one).
  void next(int32_t* inputs, int32_t* targets);
  void reset();  // back to epoch 0, window 0
  // Windows of an epoch this rank serves (all of them over world, rounded down).
  int64_t windows_per_epoch() const { return static_cast<int64_t>(order_.size()) / world_; }

  struct State {
    int64_t epoch = 0;
    int64_t index = 0;  // window of the epoch's order where the next group of micro-batches starts
    // Serialised field by field (checkpoint record data_state): kBytes little-endian bytes,
    // epoch then index as i64 (the raw struct's layout, so version 1..2 checkpoints read
    // the same).
    static constexpr size_t kBytes = 16;
    std::vector<uint8_t> to_bytes() const;
    // Refuses (st::Error naming `path`) a wrong size or a negative field.
    static State from_bytes(const std::vector<uint8_t>& b, const std::string& path);
  };
  State state() const { return {epoch_, index_}; }
  void set_state(const State& s);

 private:
  void build_order();
  void skip(int64_t windows);  // moves the position on, into later epochs as needed
  const uint16_t* window(int64_t w) const;  // first token of global window w
  const TokenSet& tokens_;
  int B_, T_;
  uint64_t seed_;
  bool shuffle_;
  int rank_, world_;
  std::vector<int64_t> first_;  // first global window of each span, then the total
  std::vector<int64_t> order_;  // the current epoch's order of all windows
  int64_t epoch_ = 0, index_ = 0;
};

}  // namespace st
