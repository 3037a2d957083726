#include "data/loader.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace st {

DataLoader::DataLoader(const std::vector<int32_t>& tokens, int B, int T, uint64_t seed,
                       bool shuffle, int rank, int world)
    : tokens_(tokens), B_(B), T_(T), seed_(seed), shuffle_(shuffle), rank_(rank), world_(world) {
  ST_CHECK(B > 0 && T > 0, "data loader: B and T must be positive");
  ST_CHECK(world > 0 && rank >= 0 && rank < world, "data loader: rank ", rank, " of ", world);
  const int64_t nwin = tokens.size() > 0 ? (static_cast<int64_t>(tokens.size()) - 1) / T : 0;
  ST_CHECK(nwin >= static_cast<int64_t>(B) * world, "the data (", tokens.size(),
           " tokens) holds ", nwin, " windows of ", T + 1, " tokens, fewer than one batch of ",
           B, " per rank x ", world, " ranks (use a shorter train.seq_len or more data)");
  build_order();
}

void DataLoader::build_order() {
  const int64_t nwin = (static_cast<int64_t>(tokens_.size()) - 1) / T_;
  std::vector<int64_t> all(nwin);
  std::iota(all.begin(), all.end(), 0);
  if (shuffle_) {
    // Fisher-Yates with a generator seeded from (seed, epoch) alone.
    Rng rng(seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch_) + 1);
    for (int64_t i = nwin - 1; i > 0; --i)
      std::swap(all[i], all[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)))]);
  }
  order_.clear();
  for (int64_t i = rank_; i < nwin; i += world_) order_.push_back(all[i] * T_);
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  for (int b = 0; b < B_; ++b) {
    if (index_ >= static_cast<int64_t>(order_.size())) {
      ++epoch_;
      index_ = 0;
      build_order();
    }
    const int32_t* w = tokens_.data() + order_[index_++];
    std::copy(w, w + T_, inputs + static_cast<size_t>(b) * T_);
    std::copy(w + 1, w + T_ + 1, targets + static_cast<size_t>(b) * T_);
  }
}

void DataLoader::reset() { set_state({0, 0}); }

void DataLoader::set_state(const State& s) {
  ST_CHECK(s.epoch >= 0 && s.index >= 0, "data loader state (", s.epoch, ", ", s.index, ")");
  epoch_ = s.epoch;
  build_order();
  ST_CHECK(s.index <= static_cast<int64_t>(order_.size()), "data loader position ", s.index,
           " is past the ", order_.size(), " windows of an epoch: the checkpoint was written "
           "for different data or batch settings");
  index_ = s.index;
}

}  // namespace st
