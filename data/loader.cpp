#include "data/loader.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace st {

DataLoader::DataLoader(const TokenSet& tokens, int B, int T, uint64_t seed, bool shuffle,
                       int rank, int world)
    : tokens_(tokens), B_(B), T_(T), seed_(seed), shuffle_(shuffle), rank_(rank), world_(world) {
  ST_CHECK(B > 0 && T > 0, "data loader: B and T must be positive");
  ST_CHECK(world > 0 && rank >= 0 && rank < world, "data loader: rank ", rank, " of ", world);
  first_.push_back(0);
  for (const TokenSpan& s : tokens.spans())
    first_.push_back(first_.back() + (s.size > 0 ? (s.size - 1) / T : 0));
  const int64_t nwin = first_.back();
  ST_CHECK(nwin >= static_cast<int64_t>(B) * world, "the data (", tokens.size(),
           " tokens) holds ", nwin, " windows of ", T + 1, " tokens, fewer than one batch of ",
           B, " per rank x ", world, " ranks (use a shorter train.seq_len or more data)");
  build_order();
}

void DataLoader::build_order() {
  const int64_t nwin = first_.back();
  std::vector<int64_t> all(nwin);
  std::iota(all.begin(), all.end(), 0);
  if (shuffle_) {
    // Fisher-Yates with a generator seeded from (seed, epoch) alone.
    Rng rng(seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch_) + 1);
    for (int64_t i = nwin - 1; i > 0; --i)
      std::swap(all[i], all[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)))]);
  }
  order_ = std::move(all);
}

void DataLoader::skip(int64_t n) {
  while (n > 0) {
    if (index_ >= static_cast<int64_t>(order_.size())) {
      ++epoch_;
      index_ = 0;
      build_order();
    }
    const int64_t take = std::min<int64_t>(n, static_cast<int64_t>(order_.size()) - index_);
    index_ += take;
    n -= take;
  }
}

const uint16_t* DataLoader::window(int64_t w) const {
  const size_t s = static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), w) -
                                       first_.begin()) - 1;
  return tokens_.spans()[s].data + (w - first_[s]) * T_;
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  skip(static_cast<int64_t>(rank_) * B_);  // the micro-batches of lower ranks
  for (int b = 0; b < B_; ++b) {
    if (index_ >= static_cast<int64_t>(order_.size())) {
      ++epoch_;
      index_ = 0;
      build_order();
    }
    const uint16_t* w = window(order_[index_++]);
    std::copy(w, w + T_, inputs + static_cast<size_t>(b) * T_);
    std::copy(w + 1, w + T_ + 1, targets + static_cast<size_t>(b) * T_);
  }
  skip(static_cast<int64_t>(world_ - 1 - rank_) * B_);  // those of higher ranks
}

std::vector<uint8_t> DataLoader::State::to_bytes() const {
  std::vector<uint8_t> b(kBytes);
  for (int i = 0; i < 8; ++i) {
    b[size_t(i)] = uint8_t(static_cast<uint64_t>(epoch) >> (8 * i));
    b[size_t(8 + i)] = uint8_t(static_cast<uint64_t>(index) >> (8 * i));
  }
  return b;
}

DataLoader::State DataLoader::State::from_bytes(const std::vector<uint8_t>& b,
                                                const std::string& path) {
  if (b.size() != kBytes)
    fail(path, ": data_state holds ", b.size(), " bytes, expected ", kBytes,
         " (damaged checkpoint or another program's file)");
  uint64_t e = 0, i = 0;
  for (int k = 0; k < 8; ++k) {
    e |= uint64_t(b[size_t(k)]) << (8 * k);
    i |= uint64_t(b[size_t(8 + k)]) << (8 * k);
  }
  State s;
  s.epoch = static_cast<int64_t>(e);
  s.index = static_cast<int64_t>(i);
  if (s.epoch < 0 || s.index < 0)
    fail(path, ": data_state position (epoch ", s.epoch, ", window ", s.index,
         ") is negative, expected both >= 0 (damaged checkpoint)");
  return s;
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
