// Checkpoint refusals and saving: records with a valid checksum but a bad name, type,
// length or value refused, inconsistent values refused, atomic save (an existing
// checkpoint replaced, a missing folder, failed saves leave the old file and no temporary),
// and a fuzz loop (damaged files never load or crash). (Round trips, the layout and the
// load errors: test_checkpoint.cpp; the shared harness: checkpoint_fixture.h.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "checkpoint_fixture.h"
#include "core/error.h"
#include "io/checkpoint.h"

using namespace st::checkpoint_test;

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
