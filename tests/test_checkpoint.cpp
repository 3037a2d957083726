// Checkpoint tests: round trips of every field, SHA-256 known answers, the documented byte
// layout (walked by an independent parser here), every error path of load_checkpoint,
// atomic save (failed saves leave the old file and no temporary), and a fuzz loop.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/error.h"
#include "core/rng.h"
#include "data/loader.h"
#include "io/checkpoint.h"

using namespace st;
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

Bytes random_bytes(std::mt19937_64& g, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = uint8_t(g());
  return b;
}

// Every field differs from its default; the values are consistent (shape records, array
// sizes, config_yaml, RNG and data states). The shape (n_head 1, n_embd 2, max_seq_len 1,
// vocabulary 1) has 8 + 74 n_layer parameters: n_layer is the smallest giving at least
// `min_params` (at most 1024).
int32_t layers_for(size_t min_params) {
  return int32_t(std::clamp<size_t>((std::max<size_t>(min_params, 8) - 8 + 73) / 74, 1, 1024));
}
size_t params_of(int32_t n_layer) { return 8 + 74 * size_t(n_layer); }
CheckpointState random_state(uint64_t seed, int32_t elem_bytes, size_t min_params) {
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
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

void expect_same(const CheckpointState& a, const CheckpointState& b) {
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

Bytes read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}
void write_file(const std::string& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

uint64_t le(const Bytes& b, size_t off, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(b[off + i]) << (8 * i);
  return v;
}
void set_le(Bytes& b, size_t off, size_t n, uint64_t v) {
  for (size_t i = 0; i < n; ++i) b[off + i] = uint8_t(v >> (8 * i));
}

// Rewrites the trailer (payload length, SHA-256) so only the semantic checks can object.
void fix_trailer(Bytes& b) {
  b.resize(b.size() - 32);
  set_le(b, b.size() - 8, 8, b.size() - 8);
  const std::string hex = sha256_hex(b.data(), b.size());
  for (size_t i = 0; i < 32; ++i)
    b.push_back(uint8_t(std::stoi(hex.substr(2 * i, 2), nullptr, 16)));
}

// A saved (version 3) file turned into format `version` with an elapsed_s record (f64)
// appended, as versions 1..2 wrote it.
Bytes with_elapsed(Bytes b, uint32_t version, double elapsed) {
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
std::vector<Rec> walk(const Bytes& b) {
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
Rec find(const Bytes& b, const std::string& name) {
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

}  // namespace

TEST(Sha256, KnownAnswers) {
  EXPECT_EQ(sha256_hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char* two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(sha256_hex(two_blocks, std::strlen(two_blocks)),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(sha256_hex(million.data(), million.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_F(Checkpoint, RoundTripEveryFieldFp32AndFp64) {
  for (int32_t elem : {4, 8}) {
    const CheckpointState s = random_state(elem, elem, 1001);
    const std::string p = path("rt" + std::to_string(elem) + ".ckpt");
    const std::string hash = save_checkpoint(p, s);
    EXPECT_EQ(hash, sha256_hex(s.master.data(), s.master.size()));
    expect_same(load_checkpoint(p), s);
  }
  EXPECT_FALSE(tmp_left(dir_));
}

// The default state has no model (n_layer 0): written (save checks only the structure),
// refused on reading.
TEST_F(Checkpoint, DefaultStateIsWrittenButNotLoaded) {
  CheckpointState s;
  EXPECT_EQ(save_checkpoint(path("d.ckpt"), s), sha256_hex("", 0));
  expect_error(path("d.ckpt"), {"inconsistent checkpoint", "compute = ''"});
}

TEST_F(Checkpoint, ByteLayoutMatchesTheDocumentedFormat) {
  const CheckpointState s = random_state(7, 4, 100);
  const Bytes b = saved(s);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "STCKPT01");
  EXPECT_EQ(le(b, 8, 4), 3u);
  const std::vector<Rec> recs = walk(b);
  EXPECT_EQ(recs.size(), 19u);
  for (const Rec& r : recs) EXPECT_NE(r.name, "elapsed_s");
  const Rec step = find(b, "step");
  EXPECT_EQ(step.type, 2u);
  EXPECT_EQ(step.len, 8u);
  EXPECT_EQ(int64_t(le(b, step.value_off, 8)), s.step);
  const Rec ls = find(b, "loss_scale");
  EXPECT_EQ(ls.type, 3u);
  uint32_t bits;
  std::memcpy(&bits, &s.loss_scale, 4);
  EXPECT_EQ(le(b, ls.value_off, 4), bits);
  const Rec master = find(b, "master");
  EXPECT_EQ(master.type, 5u);
  EXPECT_TRUE(std::equal(s.master.begin(), s.master.end(), b.begin() + master.value_off));
  EXPECT_EQ(le(b, b.size() - 40, 8), b.size() - 40);
  std::string trailer_hex;
  for (size_t i = b.size() - 32; i < b.size(); ++i) {
    char h[3];
    std::snprintf(h, sizeof h, "%02x", b[i]);
    trailer_hex += h;
  }
  EXPECT_EQ(trailer_hex, sha256_hex(b.data(), b.size() - 32));
}

TEST_F(Checkpoint, MissingFileAndNotAFile) {
  expect_error(path("nope.ckpt"), {"cannot open"});
  expect_error(dir_, {"not a regular file"});
}

TEST_F(Checkpoint, TruncatedAtManyLengths) {
  const Bytes b = saved(random_state(3, 4, 500));
  for (size_t n :
       {size_t(0), size_t(1), size_t(7), size_t(8), size_t(11), size_t(12), size_t(51), size_t(52),
        b.size() / 2, b.size() - 41, b.size() - 40, b.size() - 33, b.size() - 1}) {
    SCOPED_TRACE(n);
    expect_error(Bytes(b.begin(), b.begin() + long(n)), {"truncated"});
  }
}

TEST_F(Checkpoint, EveryFlippedByteIsCaught) {
  const Bytes b = saved(random_state(4, 4, 64));
  for (size_t i = 0; i < b.size(); ++i) {
    SCOPED_TRACE(i);
    Bytes c = b;
    c[i] ^= uint8_t(1 + i % 255);
    if (i < 8)
      expect_error(c, {"not a stabletrain checkpoint"});
    else if (i >= b.size() - 40 && i < b.size() - 32)
      expect_error(c, {"truncated or damaged"});
    else
      expect_error(c, {"corrupt: SHA-256 mismatch"});
  }
}

TEST_F(Checkpoint, WrongMagic) {
  const std::string text = "model:\n  n_layer: 12\n  n_head: 12\n  n_embd: 768\n  this is yaml\n";
  expect_error(Bytes(text.begin(), text.end()), {"not a stabletrain checkpoint"});
  Bytes b = saved(random_state(5, 4, 10));
  std::memcpy(b.data(), "STCKPT02", 8);
  expect_error(b, {"not a stabletrain checkpoint"});
}

TEST_F(Checkpoint, UnsupportedVersion) {
  const Bytes b = saved(random_state(6, 4, 10));
  for (uint32_t ver : {0u, 4u, 0xffffffffu}) {
    Bytes c = b;
    set_le(c, 8, 4, ver);
    fix_trailer(c);
    expect_error(c, {"unsupported checkpoint format version", std::to_string(ver).c_str()});
  }
}

// Version 1 (before the stability hooks) had no hooks_state record: still read, with the
// state empty; a version-2 file without it is refused.
TEST_F(Checkpoint, Version1WithoutHooksStateIsRead) {
  CheckpointState st = random_state(9, 4, 10);
  st.hooks_state = {1, 2, 3, 4, 5};
  const Bytes b = with_elapsed(saved(st), 2, 5.0);
  const Rec r = find(b, "hooks_state");
  Bytes c = b;
  c.erase(c.begin() + long(r.off), c.begin() + long(r.off + r.total));
  fix_trailer(c);
  expect_error(c, {"missing record 'hooks_state'"});
  set_le(c, 8, 4, 1);
  fix_trailer(c);
  write_file(path("v1.ckpt"), c);
  const CheckpointState got = load_checkpoint(path("v1.ckpt"));
  EXPECT_TRUE(got.hooks_state.empty());
  EXPECT_EQ(got.master, st.master);
  EXPECT_EQ(got.step, st.step);
}

// Versions 1..2 held the wall time (elapsed_s): still read back. Version 3 has none: the
// writer leaves it out and the reader refuses it (and a version-2 file without it).
TEST_F(Checkpoint, ElapsedSecondsOnlyInVersions1And2) {
  const CheckpointState st = random_state(19, 4, 10);
  const Bytes b = saved(st);
  EXPECT_EQ(load_checkpoint(path("ref.ckpt")).elapsed_s, 0.0);
  write_file(path("v2.ckpt"), with_elapsed(b, 2, 4321.25));
  const CheckpointState got = load_checkpoint(path("v2.ckpt"));
  EXPECT_EQ(got.elapsed_s, 4321.25);
  EXPECT_EQ(got.master, st.master);
  expect_error(with_elapsed(b, 3, 1.0), {"record 'elapsed_s' is not part of format version 3"});
  Bytes c = b;
  set_le(c, 8, 4, 2);
  fix_trailer(c);
  expect_error(c, {"missing record 'elapsed_s'"});
}

// Identical states give identical files: no uninitialised padding (the RNG state was once
// written as a raw struct with 7 bytes of padding) and no wall time.
TEST_F(Checkpoint, IdenticalStatesGiveByteIdenticalFiles) {
  auto build = [](uint8_t fill, double elapsed) {
    Rng::State r;
    std::memset(static_cast<void*>(&r), fill, sizeof r);
    r.s = {1, 2, 3, 0x8000000000000001ull};
    r.spare = -0.75;
    r.has_spare = true;
    DataLoader::State d;
    std::memset(static_cast<void*>(&d), fill, sizeof d);
    d.epoch = 3;
    d.index = 17;
    CheckpointState s = random_state(21, 4, 300);
    s.rng_state = r.to_bytes();
    s.data_state = d.to_bytes();
    s.elapsed_s = elapsed;
    return s;
  };
  save_checkpoint(path("a.ckpt"), build(0xAB, 12.5));
  save_checkpoint(path("b.ckpt"), build(0x00, 99.0));
  EXPECT_EQ(read_file(path("a.ckpt")), read_file(path("b.ckpt")));
  const CheckpointState got = load_checkpoint(path("a.ckpt"));
  const Rng::State r = Rng::State::from_bytes(got.rng_state, "x");
  EXPECT_EQ(r.s, (std::array<uint64_t, 4>{1, 2, 3, 0x8000000000000001ull}));
  EXPECT_EQ(r.spare, -0.75);
  EXPECT_TRUE(r.has_spare);
  const DataLoader::State d = DataLoader::State::from_bytes(got.data_state, "x");
  EXPECT_EQ(d.epoch, 3);
  EXPECT_EQ(d.index, 17);
}

// The field serialisations: the layout of the raw structs of versions 1..2 (x86-64), any
// padding ignored; wrong sizes and impossible values refused naming the file.
TEST(StateBytes, RngAndDataLoaderLayoutsAndRefusals) {
  Rng g(5);
  g.normal();  // leaves a spare
  const Rng::State st = g.state();
  Bytes raw(sizeof st);
  std::memcpy(raw.data(), &st, sizeof st);
  ASSERT_EQ(raw.size(), Rng::State::kBytes);
  for (size_t i = 41; i < raw.size(); ++i) raw[i] = 0xCD;  // garbage padding of old files
  Rng h;
  h.set_state(Rng::State::from_bytes(raw, "old.ckpt"));
  EXPECT_EQ(h.normal(), g.normal());
  EXPECT_EQ(h.next_u64(), g.next_u64());
  Bytes b = st.to_bytes();
  for (size_t i = 41; i < b.size(); ++i) EXPECT_EQ(b[i], 0) << i;
  auto refused = [](auto fn, const char* want) {
    try {
      fn();
      ADD_FAILURE() << "accepted; expected " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("f.ckpt"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused([&] { Rng::State::from_bytes(Bytes(40), "f.ckpt"); }, "holds 40 bytes, expected 48");
  refused([&] { Rng::State::from_bytes(Bytes(48), "f.ckpt"); }, "all zero");
  Bytes c = b;
  c[40] = 2;
  refused([&] { Rng::State::from_bytes(c, "f.ckpt"); }, "has_spare byte is 2");
  c = b;
  c[39] = 0x7f, c[38] = 0xf0;  // spare = +inf (or NaN)
  for (int i = 32; i < 38; ++i) c[size_t(i)] = 0;
  refused([&] { Rng::State::from_bytes(c, "f.ckpt"); }, "not finite");

  const DataLoader::State d{5, 123456789012};
  const Bytes db = d.to_bytes();
  Bytes draw(sizeof d);
  std::memcpy(draw.data(), &d, sizeof d);
  EXPECT_EQ(db, draw);
  const DataLoader::State e = DataLoader::State::from_bytes(db, "f.ckpt");
  EXPECT_EQ(e.epoch, 5);
  EXPECT_EQ(e.index, 123456789012);
  refused([&] { DataLoader::State::from_bytes(Bytes(24), "f.ckpt"); }, "holds 24 bytes, expected 16");
  Bytes neg = db;
  neg[15] = 0x80;
  refused([&] { DataLoader::State::from_bytes(neg, "f.ckpt"); }, "negative");
}

TEST_F(Checkpoint, BadRecordsWithValidChecksum) {
  const Bytes b = saved(random_state(8, 4, 1001));
  {  // a record removed
    const Rec r = find(b, "adam_step");
    Bytes c = b;
    c.erase(c.begin() + long(r.off), c.begin() + long(r.off + r.total));
    fix_trailer(c);
    expect_error(c, {"missing record 'adam_step'"});
  }
  {  // a record twice
    const Rec r = find(b, "rng_state");
    Bytes c = b;
    c.insert(c.begin() + long(r.off), b.begin() + long(r.off), b.begin() + long(r.off + r.total));
    fix_trailer(c);
    expect_error(c, {"duplicate record 'rng_state'"});
  }
  {  // length past the end
    const Rec r = find(b, "data_state");
    Bytes c = b;
    set_le(c, r.value_off - 8, 8, uint64_t(1) << 62);
    fix_trailer(c);
    expect_error(c, {"'data_state'", "runs past the end"});
  }
  {  // unknown name, wrong type, wrong scalar length
    const Rec r = find(b, "step");
    Bytes c = b;
    c[r.off + 2] = 'S';
    fix_trailer(c);
    expect_error(c, {"unknown record 'Step'"});
    c = b;
    c[r.value_off - 9] = 1;
    fix_trailer(c);
    expect_error(c, {"record 'step' has type 1, expected 2"});
  }
  {  // elem size 8 with 4-byte arrays; then m one element short
    const Rec r = find(b, "master_elem_bytes");
    Bytes c = b;
    set_le(c, r.value_off, 4, 8);
    fix_trailer(c);
    expect_error(c, {"master holds 522 values of 8 bytes", "give 1044 parameters"});
    set_le(c, r.value_off, 4, 2);
    fix_trailer(c);
    expect_error(c, {"master_elem_bytes is 2"});
    const Rec m = find(b, "m");
    c = b;
    c.erase(c.begin() + long(m.value_off), c.begin() + long(m.value_off + 4));
    set_le(c, m.value_off - 8, 8, m.len - 4);
    fix_trailer(c);
    expect_error(c, {"inconsistent array sizes", "m 4172"});
  }
}

// Checksum-valid files whose values are impossible or disagree with each other: each is
// refused with the field, its value and what was expected (all were loaded before).
TEST_F(Checkpoint, InconsistentValuesAreRefused) {
  const CheckpointState good = random_state(30, 4, 300);
  const size_t np = params_of(good.n_layer);
  const struct {
    std::function<void(CheckpointState&)> edit;
    std::vector<const char*> want;
  } cases[] = {
      {[](auto& s) { s.step = INT64_MIN; },
       {"step = -9223372036854775808, expected 0..99999999 (checkpoint names have 8 digits)"}},
      {[](auto& s) { s.step = int64_t(1) << 62; }, {"step = 4611686018427387904, expected 0.."}},
      {[](auto& s) { s.step = 100000000, s.adam_step = 1; }, {"step = 100000000, expected"}},
      {[](auto& s) { s.adam_step = -1; }, {"adam_step = -1, expected 0..step ("}},
      {[](auto& s) { s.adam_step = int64_t(1) << 40; }, {"adam_step = 1099511627776"}},
      {[](auto& s) { s.adam_step = s.step + 1; }, {"one Adam update at most per step"}},
      {[](auto& s) { s.loss_scale = std::nanf(""); },
       {"loss_scale = nan", "the fp16 loss scaler's bounds"}},
      {[](auto& s) { s.loss_scale = INFINITY; }, {"loss_scale = inf"}},
      {[](auto& s) { s.loss_scale = 0; }, {"loss_scale = 0,"}},
      {[](auto& s) { s.loss_scale = -2; }, {"loss_scale = -2"}},
      {[](auto& s) { s.loss_scale = 1e-45f; }, {"loss_scale = 1.4013e-45, expected 1..1.67772e+07"}},
      {[](auto& s) { s.loss_scale = 0.5f; }, {"loss_scale = 0.5, expected 1.."}},
      {[](auto& s) { s.loss_scale = 33554432.0f; }, {"loss_scale = 3.35544e+07"}},
      {[](auto& s) { s.loss_scale_good_steps = -5; }, {"loss_scale_good_steps = -5"}},
      // Formats other than fp16 train unscaled (the probe's crafted fp32 resume with a
      // scale of 1e-45 wrote a NaN checkpoint).
      {[](auto& s) { s.compute = "fp32"; }, {"with compute fp32, expected 1 and 0"}},
      {[](auto& s) { s.compute = "bf16", s.loss_scale = 1; },
       {"loss_scale_good_steps = ", "with compute bf16, expected 1 and 0"}},
      {[](auto& s) { s.compute = "fp8"; }, {"compute = 'fp8'", "fp32, bf16, fp16 or fp64"}},
      {[](auto& s) { s.compute = ""; }, {"compute = ''"}},
      {[](auto& s) { s.n_layer = 357908024; }, {"n_layer = 357908024 is out of range"}},
      {[](auto& s) { s.n_layer = -1; }, {"n_layer = -1 is out of range"}},
      {[](auto& s) { s.n_head = 0; }, {"n_head = 0 is out of range"}},
      {[](auto& s) { s.n_head = 3; }, {"n_embd = 2 is not divisible by n_head = 3"}},
      {[](auto& s) { s.n_head = 65; }, {"n_head = 65 is out of range, expected 1..64"}},
      {[](auto& s) { s.n_embd = 3, s.n_head = 2; }, {"n_embd = 3 is not divisible by n_head = 2"}},
      {[](auto& s) { s.n_embd = 1 << 20; }, {"n_embd = 1048576 is out of range"}},
      {[](auto& s) { s.max_seq_len = 0; }, {"max_seq_len = 0 is out of range"}},
      {[](auto& s) { s.vocab_size = -3; }, {"vocab_size = -3 is out of range"}},
      {[](auto& s) { s.padded_vocab_size = 0; }, {"padded_vocab_size = 0 is below vocab_size"}},
      {[](auto& s) { s.vocab_size = 2; }, {"padded_vocab_size = 1 is below vocab_size = 2"}},
      {[](auto& s) { s.padded_vocab_size = (1 << 24) + 1; s.vocab_size = 1 << 24; },
       {"padded_vocab_size = 16777217 is out of range"}},
      // Shape records in bounds but not the arrays' (config_yaml updated to agree).
      {[](auto& s) { s.max_seq_len = 2; }, {"master holds", "give"}},
      {[](auto& s) { s.n_layer += 1; s.config_yaml = ""; }, {"master holds", "parameters"}},
      {[](auto& s) { s.rng_state.resize(40); }, {"rng_state holds 40 bytes, expected 48"}},
      {[](auto& s) { s.rng_state.assign(48, 0); }, {"rng_state generator state is all zero"}},
      {[](auto& s) { s.rng_state[40] = 7; }, {"has_spare byte is 7"}},
      {[](auto& s) { s.data_state.resize(17); }, {"data_state holds 17 bytes, expected 16"}},
      {[](auto& s) { s.data_state[7] = 0xff; }, {"data_state position", "negative"}},
      {[](auto& s) { s.shard_rank = -2; }, {"shard_rank = -2"}},
      {[](auto& s) { s.shard_end = 4; }, {"shard elements [0, 4)", "no shard_rank"}},
      {[](auto& s) { s.dist_world = 1 << 21; }, {"dist_world = 2097152"}},
      {[&](auto& s) {  // a rank file whose shard ends past the parameters
         s.dist_world = s.optim_shards = 2;
         s.shard_rank = 1;
         s.shard_begin = int64_t(np) - 2;
         s.shard_end = int64_t(np) + 2;
         s.master.resize(4 * 4);
         s.m = s.v = s.master;
       },
       {"end past the", "parameters of the shape records"}},
      {[](auto& s) { s.config_yaml = "model:\n  n_layer: 7\n"; },
       {"config_yaml says model.n_layer: '7' but the record n_layer is"}},
      {[](auto& s) { s.config_yaml = "model: {n_head: 2x}\n"; }, {"model.n_head: '2x'"}},
      {[](auto& s) { s.config_yaml = "model: {n_embd: 2.0}\n"; }, {"model.n_embd: '2.0'"}},
      {[](auto& s) { s.config_yaml = "model: {vocab_size: [1]}\n"; },
       {"model.vocab_size: '(not a scalar)'"}},
      {[](auto& s) { s.config_yaml = "model: [\n"; }, {"config_yaml is not valid YAML"}},
      {[](auto& s) { s.config_yaml = "just text"; }, {"config_yaml is not a YAML mapping"}},
      {[](auto& s) { s.config_yaml = "model: 3\n"; }, {"model section is not a mapping"}},
      {[](auto& s) { s.config_yaml = "run: {name: \"a\xff\xfe" "b\"}\n"; },
       {"config_yaml holds 2 bytes that are not UTF-8"}},
      {[](auto& s) { s.config_yaml = "precision: {compute: bf16}\n"; },
       {"config_yaml says precision.compute: 'bf16' but the record compute is 'fp16'"}},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(i++);
    CheckpointState s = good;
    c.edit(s);
    const std::string p = path("v" + std::to_string(i) + ".ckpt");
    save_checkpoint(p, s);
    try {
      load_checkpoint(p);
      ADD_FAILURE() << "loaded; expected: " << c.want[0];
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p + ": inconsistent checkpoint: "), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      for (const char* w : c.want) EXPECT_NE(msg.find(w), std::string::npos) << msg;
    }
  }
  // The unedited state, a main file of a sharded run and empty RNG/data states (a file not
  // written by the trainer) load.
  save_checkpoint(path("ok.ckpt"), good);
  EXPECT_NO_THROW(load_checkpoint(path("ok.ckpt")));
  CheckpointState main = good;
  main.dist_world = main.optim_shards = 4;
  main.m.clear();
  main.v.clear();
  main.rng_state.clear();
  main.data_state.clear();
  main.config_yaml.clear();
  save_checkpoint(path("main.ckpt"), main);
  EXPECT_NO_THROW(load_checkpoint(path("main.ckpt")));
}

TEST_F(Checkpoint, SaveReplacesAnExistingCheckpoint) {
  const std::string p = path("c.ckpt");
  save_checkpoint(p, random_state(10, 4, 300));
  const CheckpointState s2 = random_state(11, 8, 200);
  save_checkpoint(p, s2);
  expect_same(load_checkpoint(p), s2);
  EXPECT_FALSE(tmp_left(dir_));
}

TEST_F(Checkpoint, SaveIntoMissingDirectoryThrowsAndLeavesNothing) {
  const std::string p = path("no/such/dir/c.ckpt");
  try {
    save_checkpoint(p, random_state(12, 4, 10));
    ADD_FAILURE() << "save succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(path("no")));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(Checkpoint, FailedSavesLeaveTheOldFileIntact) {
  const std::string good = path("good.ckpt");
  save_checkpoint(good, random_state(13, 4, 300));
  const Bytes before = read_file(good);
  // Rename fails: the target is a (non-empty) directory.
  const std::string as_dir = path("dir.ckpt");
  fs::create_directory(as_dir);
  write_file(as_dir + "/keep", {1, 2, 3});
  EXPECT_THROW(save_checkpoint(as_dir, random_state(14, 4, 300)), Error);
  EXPECT_TRUE(fs::is_directory(as_dir));
  EXPECT_EQ(read_file(as_dir + "/keep"), (Bytes{1, 2, 3}));
  // Inconsistent state: refused before anything is written.
  CheckpointState bad = random_state(15, 4, 300);
  bad.v.pop_back();
  EXPECT_THROW(save_checkpoint(good, bad), Error);
  // A write fails half way (file size limit; works as root too).
  struct rlimit old_lim;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_lim), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old_lim;
  lim.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg;
  try {
    save_checkpoint(good, random_state(16, 4, 100000));
  } catch (const Error& e) {
    msg = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_lim), 0);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find(good), std::string::npos) << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_EQ(read_file(good), before);
  EXPECT_FALSE(tmp_left(dir_));
  EXPECT_FALSE(tmp_left(as_dir));
}

TEST_F(Checkpoint, FuzzedFilesNeverLoadOrCrash) {
  const Bytes b = saved(random_state(17, 4, 700));
  std::mt19937_64 g(1234);
  auto mutate = [&](Bytes c) {
    switch (g() % 5) {
      case 0:
        c.resize(g() % c.size());
        break;  // truncate
      case 1:
        c[g() % c.size()] ^= uint8_t(1 + g() % 255);
        break;  // flip one byte
      case 2:   // overwrite a run
        for (size_t i = g() % c.size(), k = 0; i < c.size() && k < 1 + g() % 64; ++i, ++k)
          c[i] = uint8_t(g());
        break;
      case 3:
        c.insert(c.begin() + long(g() % c.size()), uint8_t(g()));
        break;  // insert
      default:
        c.erase(c.begin() + long(g() % c.size()));
        break;  // delete
    }
    return c;
  };
  for (int it = 0; it < 200; ++it) {
    const Bytes c = mutate(b);
    write_file(path("f.ckpt"), c);
    if (c == b) continue;  // no-op mutation
    EXPECT_THROW(load_checkpoint(path("f.ckpt")), Error) << "iteration " << it;
  }
  // With the trailer recomputed the parser itself sees the damage: error or load, no crash.
  int loaded = 0;
  for (int it = 0; it < 200; ++it) {
    Bytes c = mutate(b);
    if (c.size() < 52) continue;
    std::memcpy(c.data(), "STCKPT01", 8);
    fix_trailer(c);
    write_file(path("f.ckpt"), c);
    try {
      load_checkpoint(path("f.ckpt"));
      ++loaded;
    } catch (const Error&) {
    }
  }
  RecordProperty("structural_mutations_loaded", loaded);
}
