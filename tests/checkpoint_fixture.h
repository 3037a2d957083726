// The checkpoint tests' harness, shared by test_checkpoint.cpp and
// test_checkpoint_refusals.cpp: random states of any size, a bit-level comparison, an
// independent walk of the documented record layout, little-endian field access, the
// trailer recomputed, and the Checkpoint fixture (a fresh folder per test; load must fail
// naming the file).
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/loader.h"
#include "io/checkpoint.h"

namespace st::checkpoint_test {

using namespace st;
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

inline Bytes random_bytes(std::mt19937_64& g, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = uint8_t(g());
  return b;
}

// Every field differs from its default; the values are consistent (shape records, array
// sizes, config_yaml, RNG and data states). The shape (n_head 1, n_embd 2, max_seq_len 1,
// vocabulary 1) has 8 + 74 n_layer parameters: n_layer is the smallest giving at least
// `min_params` (at most 1024).
inline int32_t layers_for(size_t min_params) {
  return int32_t(std::clamp<size_t>((std::max<size_t>(min_params, 8) - 8 + 73) / 74, 1, 1024));
}
inline size_t params_of(int32_t n_layer) { return 8 + 74 * size_t(n_layer); }
inline CheckpointState random_state(uint64_t seed, int32_t elem_bytes, size_t min_params) {
  std::mt19937_64 g(seed);
  CheckpointState s;
  s.n_layer = layers_for(min_params), s.n_head = 1, s.n_embd = 2, s.max_seq_len = 1;
  s.vocab_size = 1, s.padded_vocab_size = 1;
  s.config_yaml = "run:\n  name: t" + std::to_string(g() % 1000) + "\nmodel:\n  n_layer: " +
                  std::to_string(s.n_layer) + "\n  n_embd: 2\n";
  s.step = int64_t(g() % 100000) + 4;
  s.adam_step = s.step - 3;  // three skipped updates (fp16 overflows)
  s.compute = elem_bytes == 8 ? "fp64" : "fp16";
  s.master_elem_bytes = elem_bytes;
  s.master = random_bytes(g, params_of(s.n_layer) * size_t(elem_bytes));
  s.m = random_bytes(g, s.master.size());
  s.v = random_bytes(g, s.master.size());
  s.loss_scale = 32768.0f * float(g() % 7 + 1) + 0.5f;  // fp16 only: fp64 trains unscaled
  s.loss_scale_good_steps = int32_t(g() % 2000) + 1;
  if (elem_bytes == 8) s.loss_scale = 1, s.loss_scale_good_steps = 0;
  Rng r(g());
  r.normal();
  s.rng_state = r.state().to_bytes();
  s.data_state = DataLoader::State{int64_t(g() % 100), int64_t(g() % 1000)}.to_bytes();
  s.elapsed_s = 1234.5678 + double(g() % 100) * 1e-3;
  s.hooks_state = random_bytes(g, 56);
  return s;
}

template <class T>
inline bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

inline void expect_same(const CheckpointState& a, const CheckpointState& b) {
  EXPECT_EQ(a.config_yaml, b.config_yaml);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.adam_step, b.adam_step);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.padded_vocab_size, b.padded_vocab_size);
  EXPECT_EQ(a.compute, b.compute);
  EXPECT_EQ(a.master_elem_bytes, b.master_elem_bytes);
  EXPECT_TRUE(a.master == b.master);
  EXPECT_TRUE(a.m == b.m);
  EXPECT_TRUE(a.v == b.v);
  EXPECT_TRUE(same_bits(a.loss_scale, b.loss_scale));
  EXPECT_EQ(a.loss_scale_good_steps, b.loss_scale_good_steps);
  EXPECT_TRUE(a.rng_state == b.rng_state);
  EXPECT_TRUE(a.data_state == b.data_state);
  (void)b.elapsed_s;
  EXPECT_EQ(a.elapsed_s, 0.0) << "version 3 does not hold elapsed_s";
  EXPECT_EQ(a.hooks_state, b.hooks_state);
}

inline Bytes read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}
inline void write_file(const std::string& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

inline uint64_t le(const Bytes& b, size_t off, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(b[off + i]) << (8 * i);
  return v;
}
inline void set_le(Bytes& b, size_t off, size_t n, uint64_t v) {
  for (size_t i = 0; i < n; ++i) b[off + i] = uint8_t(v >> (8 * i));
}

// Rewrites the trailer (payload length, SHA-256) so only the semantic checks can object.
inline void fix_trailer(Bytes& b) {
  b.resize(b.size() - 32);
  set_le(b, b.size() - 8, 8, b.size() - 8);
  const std::string hex = sha256_hex(b.data(), b.size());
  for (size_t i = 0; i < 32; ++i)
    b.push_back(uint8_t(std::stoi(hex.substr(2 * i, 2), nullptr, 16)));
}

// A saved (version 3) file turned into format `version` with an elapsed_s record (f64)
// appended, as versions 1..2 wrote it.
inline Bytes with_elapsed(Bytes b, uint32_t version, double elapsed) {
  const std::string name = "elapsed_s";
  Bytes rec(2 + name.size() + 1 + 8 + 8);
  set_le(rec, 0, 2, name.size());
  std::memcpy(&rec[2], name.data(), name.size());
  rec[2 + name.size()] = 4;
  set_le(rec, 3 + name.size(), 8, 8);
  uint64_t bits;
  std::memcpy(&bits, &elapsed, 8);
  set_le(rec, 11 + name.size(), 8, bits);
  b.insert(b.end() - 40, rec.begin(), rec.end());
  set_le(b, 8, 4, version);
  fix_trailer(b);
  return b;
}

// Independent walk of the documented record layout.
struct Rec {
  std::string name;
  size_t off, type, len, value_off, total;
};
inline std::vector<Rec> walk(const Bytes& b) {
  std::vector<Rec> out;
  size_t p = 12;
  while (p < b.size() - 40) {
    Rec r;
    r.off = p;
    const size_t nl = le(b, p, 2);
    r.name.assign(reinterpret_cast<const char*>(&b[p + 2]), nl);
    r.type = b[p + 2 + nl];
    r.len = le(b, p + 3 + nl, 8);
    r.value_off = p + 11 + nl;
    r.total = 11 + nl + r.len;
    p += r.total;
    out.push_back(r);
  }
  EXPECT_EQ(p, b.size() - 40);
  return out;
}
inline Rec find(const Bytes& b, const std::string& name) {
  for (const Rec& r : walk(b))
    if (r.name == name) return r;
  ADD_FAILURE() << "no record " << name;
  return {};
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "st_ckpt_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  bool tmp_left(const std::string& d) const {
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
    return false;
  }
  // load must throw st::Error whose message names the file and contains every `want`.
  void expect_error(const std::string& p, std::initializer_list<const char*> want) {
    try {
      load_checkpoint(p);
      ADD_FAILURE() << "load of " << p << " succeeded";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      for (const char* w : want) EXPECT_NE(msg.find(w), std::string::npos) << msg;
    }
  }
  void expect_error(const Bytes& b, std::initializer_list<const char*> want) {
    write_file(path("bad.ckpt"), b);
    expect_error(path("bad.ckpt"), want);
  }
  Bytes saved(const CheckpointState& s) {
    save_checkpoint(path("ref.ckpt"), s);
    return read_file(path("ref.ckpt"));
  }
  std::string dir_;
};

}  // namespace st::checkpoint_test
