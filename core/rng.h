// Deterministic random numbers with a state that can be saved and restored exactly:
// xoshiro256** seeded through splitmix64; normals by Box-Muller in double, so the
// stream is the same on every compiler and standard library.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace st {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed) {
    for (auto& w : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
    has_spare_ = false;
  }
  uint64_t next_u64() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n) (n > 0), unbiased by rejection.
  uint64_t below(uint64_t n) {
    const uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next_u64();
    while (x >= lim);
    return x % n;
  }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1;
    do u1 = uniform();
    while (u1 <= 0.0);
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(6.283185307179586 * u2);
    has_spare_ = true;
    return r * std::cos(6.283185307179586 * u2);
  }

  struct State {
    std::array<uint64_t, 4> s;
    double spare;
    bool has_spare;
    // Serialised field by field (checkpoint record rng_state), never as the raw struct (its
    // padding is uninitialised): kBytes little-endian bytes, s[0..3] as u64, spare as the
    // u64 of its IEEE bits, has_spare as one byte 0 or 1, then 7 zero bytes. That is the
    // raw struct's layout on x86-64, so checkpoints of versions 1..2 (written as the raw
    // struct) read the same; their 7 padding bytes may hold garbage and are ignored.
    static constexpr size_t kBytes = 48;
    std::vector<uint8_t> to_bytes() const {
      std::vector<uint8_t> b(kBytes, 0);
      uint64_t spare_bits;
      std::memcpy(&spare_bits, &spare, 8);
      for (int w = 0; w < 5; ++w)
        for (int i = 0; i < 8; ++i)
          b[size_t(8 * w + i)] = uint8_t((w < 4 ? s[size_t(w)] : spare_bits) >> (8 * i));
      b[40] = has_spare ? 1 : 0;
      return b;
    }
    // Refuses (st::Error naming `path`) a wrong size, has_spare not 0/1, a non-finite spare
    // or the all-zero generator state (xoshiro would return zeros forever).
    static State from_bytes(const std::vector<uint8_t>& b, const std::string& path) {
      if (b.size() != kBytes)
        fail(path, ": rng_state holds ", b.size(), " bytes, expected ", kBytes,
             " (damaged checkpoint or another program's file)");
      uint64_t w[5] = {};
      for (int k = 0; k < 5; ++k)
        for (int i = 0; i < 8; ++i) w[k] |= uint64_t(b[size_t(8 * k + i)]) << (8 * i);
      State st{};
      for (int k = 0; k < 4; ++k) st.s[size_t(k)] = w[k];
      std::memcpy(&st.spare, &w[4], 8);
      if (b[40] > 1)
        fail(path, ": rng_state has_spare byte is ", int(b[40]),
             ", expected 0 or 1 (damaged checkpoint)");
      st.has_spare = b[40] == 1;
      if (!std::isfinite(st.spare))
        fail(path, ": rng_state spare normal is not finite (damaged checkpoint)");
      if ((w[0] | w[1] | w[2] | w[3]) == 0)
        fail(path,
             ": rng_state generator state is all zero, which no seed produces (damaged "
             "checkpoint)");
      return st;
    }
  };
  State state() const { return {s_, spare_, has_spare_}; }
  void set_state(const State& st) {
    s_ = st.s;
    spare_ = st.spare;
    has_spare_ = st.has_spare;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> s_{};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace st
