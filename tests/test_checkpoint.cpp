// Checkpoint tests: round trips of every field, SHA-256 known answers, the documented byte
// layout (walked by an independent parser here), the load errors of a damaged file
// (missing, truncated, a flipped byte, wrong magic or version), older versions read,
// byte-identical files, and the RNG and data-loader state layouts. (Records refused with a
// valid checksum, atomic save and the fuzz loop: test_checkpoint_refusals.cpp; the shared
// harness: checkpoint_fixture.h.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "checkpoint_fixture.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/loader.h"
#include "io/checkpoint.h"

using namespace st::checkpoint_test;

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
