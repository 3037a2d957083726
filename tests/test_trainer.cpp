// The trainer on bad input, end to end on a tiny model: every class of bad input through
// the real `train` binary or run_training (damaged hook states and checkpoints, bad config
// values, a missing data file, an existing run folder, a run that cannot fit in memory, a
// NaN loss, CUDA without a GPU): the error text, the exit code, and that nothing existing
// was overwritten. (Determinism, resume and the log: test_trainer_runs.cpp; the shared
// harness: trainer_fixture.h.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>

#include "backends/backends.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "train/hooks.h"
#include "trainer_fixture.h"

using namespace st::trainer_test;

// The 8-byte slots of a hook state (train/hooks.cpp's layout: tag, two counts, the power
// vectors, delta_drift_cum, the error directions, two spike windows; every vector a length
// then f64 values): what each slot holds.
enum class Slot { kHeader, kLength, kUnitValue, kFreeValue, kWindowValue };
std::vector<Slot> hook_state_slots(const std::vector<uint8_t>& b) {
  auto u64 = [&](size_t off) {
    uint64_t x = 0;
    std::memcpy(&x, b.data() + off, 8);
    return x;
  };
  std::vector<Slot> slots = {Slot::kHeader, Slot::kHeader, Slot::kHeader};
  const uint64_t np = u64(8), nd = u64(16);
  auto vec = [&](Slot values) {
    const uint64_t n = u64(slots.size() * 8);
    slots.push_back(Slot::kLength);
    slots.insert(slots.end(), n, values);
  };
  for (uint64_t i = 0; i < np; ++i) vec(Slot::kUnitValue);
  vec(Slot::kFreeValue);  // delta_drift_cum: running sums, any finite value
  for (uint64_t i = 0; i < nd; ++i) vec(Slot::kUnitValue);
  vec(Slot::kWindowValue);  // losses
  vec(Slot::kWindowValue);  // gradient norms
  EXPECT_EQ(slots.size() * 8, b.size()) << "the test's idea of the layout is out of date";
  return slots;
}

// A checksum-valid checkpoint with a damaged hooks_state (the probe: 0xff bytes or 2^40 at
// offsets 32..1000 resumed in silence, and a NaN sigma reached spectral.csv). Every 8-byte
// slot, with both values: refused with one line naming the field and offset, or -- where
// the value is one a valid state may hold (a finite running sum, a window value >= 0) --
// taken back exactly as written. In process for every slot, then through `train` for three.
TEST(TrainBadInput, DamagedHooksStateIsRefusedAtEveryOffset) {
  auto cfg = [](const std::string& name) {
    return parse_config(base_yaml((tmp_root() / name).string(), "fp32"), name + ".yaml",
                        {"hooks.every=5"});
  };
  TrainOptions first = quiet();
  first.stop_after = 5;
  run_training(cfg("hooks_src"), first);
  const std::string src = (tmp_root() / "hooks_src" / "ckpt_00000005.bin").string();
  const CheckpointState good = load_checkpoint(src);
  const std::vector<Slot> slots = hook_state_slots(good.hooks_state);
  ASSERT_GT(std::count(slots.begin(), slots.end(), Slot::kUnitValue), 100)
      << "no power-iteration vectors or error directions in the state";

  const Config c = cfg("hooks_unit");
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  GPT2 model(model_config(c), *be, DType::F32);
  const fs::path scratch = tmp_root() / "hooks_unit";
  fs::create_directories(scratch);
  auto log = std::make_shared<spdlog::logger>("hooks_unit");  // no sinks: quiet
  auto resume = [&](const std::vector<uint8_t>& state) {
    StabilityHooks h(c, model, scratch.string(), log);
    h.resume(5, state);
    return h.state();
  };
  ASSERT_EQ(resume(good.hooks_state), good.hooks_state);
  int refused = 0, kept = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    for (const uint64_t value : {~uint64_t{0}, uint64_t{1} << 40}) {
      std::vector<uint8_t> bad = good.hooks_state;
      std::memcpy(bad.data() + 8 * i, &value, 8);
      if (bad == good.hooks_state) continue;
      // 2^40's bits are the double 5.4e-312: a valid running sum or window value, and in
      // place of a value below ~1e-6 in a unit vector, still a unit vector to the 1e-12 the
      // reader allows for rounding (a change no check can tell from a valid state). Near
      // that edge either answer is right.
      double was = 0, now = 0;
      std::memcpy(&was, good.hooks_state.data() + 8 * i, 8);
      std::memcpy(&now, &value, 8);
      const double dlen = std::fabs(now * now - was * was) / 2;  // change of the length
      if (slots[i] == Slot::kUnitValue && dlen > 0.5e-12 && dlen < 2e-12) continue;
      const bool valid_value =
          value != ~uint64_t{0} &&
          (slots[i] == Slot::kFreeValue || slots[i] == Slot::kWindowValue ||
           (slots[i] == Slot::kUnitValue && dlen <= 0.5e-12));
      try {
        const std::vector<uint8_t> back = resume(bad);
        EXPECT_TRUE(valid_value) << "offset " << 8 * i << " value " << value << " (was " << was
                                 << ", slot kind " << int(slots[i]) << "): accepted";
        EXPECT_EQ(back, bad) << "offset " << 8 * i << ": accepted but not kept as written";
        ++kept;
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_FALSE(valid_value) << "offset " << 8 * i << ": " << msg;
        EXPECT_NE(msg.find("checkpoint hooks_state is damaged: "), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        ++refused;
      }
    }
  }
  std::printf("  hooks_state of %zu bytes: %d damaged copies refused, %d holding valid values "
              "kept exactly\n", good.hooks_state.size(), refused, kept);
  // Cut short, and a byte too many.
  for (const size_t n : {size_t{24}, good.hooks_state.size() - 1, good.hooks_state.size() + 8}) {
    std::vector<uint8_t> bad = good.hooks_state;
    bad.resize(n);
    EXPECT_THROW(resume(bad), Error) << n << " bytes";
  }

  // Through train: refused naming the checkpoint, nothing written (no NaN row in
  // spectral.csv, the checkpoint as it was).
  const std::string sigma_before = slurp(tmp_root() / "hooks_src" / "spectral.csv");
  int k = 0;
  // (offset, value, the byte the message names: a vector no longer of unit length is named
  // by its length field, at 24)
  for (const auto& [off, value, named] : std::vector<std::tuple<size_t, uint64_t, size_t>>{
           {32, ~uint64_t{0}, 32}, {8, uint64_t{1} << 40, 8}, {40, uint64_t{1} << 40, 24}}) {
    SCOPED_TRACE(off);
    const std::string name = "hooks_bad" + std::to_string(k++);
    fs::remove_all(tmp_root() / name);
    fs::copy(tmp_root() / "hooks_src", tmp_root() / name, fs::copy_options::recursive);
    CheckpointState s = good;
    std::memcpy(s.hooks_state.data() + off, &value, 8);
    const std::string ck = (tmp_root() / name / "ckpt_00000005.bin").string();
    save_checkpoint(ck, s);
    const std::string ck_bytes = slurp(ck);
    TrainOptions again = quiet();
    again.resume = true;
    const std::string msg = st::test::error_message_of<Error>([&] { run_training(cfg(name), again); });
    EXPECT_NE(msg.find(ck + ": checkpoint hooks_state is damaged: "), std::string::npos) << msg;
    EXPECT_NE(msg.find("(byte " + std::to_string(named) + " of "), std::string::npos) << msg;
    EXPECT_EQ(slurp(tmp_root() / name / "spectral.csv"), sigma_before);
    EXPECT_EQ(slurp(ck), ck_bytes);
    std::printf("  %s\n", msg.c_str());
  }
}

// A weight that is not finite is never written as a checkpoint (the probe's crafted resume
// wrote a NaN checkpoint and exited 0): the run stops naming the last good checkpoint. The
// NaN sits in a position-embedding row the run never reads (train.seq_len 8 of
// max_seq_len 16), so the loss stays finite and only the guard can catch it.
TEST(TrainBadInput, NonFiniteWeightsAreNeverCheckpointed) {
  const std::string dir = (tmp_root() / "nanw").string();
  const std::string path = write_yaml("nanw.yaml", base_yaml(dir, "fp32"));
  const std::string set = " --set train.seq_len=8 --set hooks.every=0";
  ASSERT_EQ(train_cmd("--config " + path + set + " --stop-after 5").code, 0);
  const std::string ck = dir + "/ckpt_00000005.bin";
  CheckpointState s = load_checkpoint(ck);
  const size_t wpe_row15 = size_t(256 * 32 + 15 * 32);  // wte (Vp x C), then wpe row 15
  const float nan = std::nanf("");
  std::memcpy(s.master.data() + 4 * wpe_row15, &nan, 4);
  save_checkpoint(ck, s);
  const Cmd r = train_cmd("--config " + path + set + " --resume");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("step 10: 1 master weight is not finite; no checkpoint written, stopping "
                       "(last good checkpoint: " + ck + ")"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/ckpt_00000010.bin"));
  std::printf("  %s", r.err.c_str());
}

TEST(TrainBadInput, UnknownKeyWrongTypeOutOfRange) {
  const std::string dir = (tmp_root() / "bad_cfg").string();
  std::string y = base_yaml(dir, "fp32");
  struct Case {
    std::string from, to, expect;
  } cases[] = {
      {"max_steps: 20", "max_step: 20", "train.max_step"},
      {"batch_size: 4", "batch_size: four", "train.batch_size"},
      {"lr: 3.0e-3", "lr: -1", "train.lr"},
  };
  for (const auto& c : cases) {
    std::string t = y;
    t.replace(t.find(c.from), c.from.size(), c.to);
    const std::string path = write_yaml("bad.yaml", t);
    const Cmd r = train_cmd("--config " + path);
    EXPECT_NE(r.code, 0) << c.to;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("bad.yaml"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
    EXPECT_FALSE(fs::exists(dir)) << "a bad config created the run directory";
    std::printf("  %-22s -> %s", c.to.c_str(), r.err.c_str());
  }
}

TEST(TrainBadInput, MissingDataFile) {
  const std::string path = write_yaml("nodata.yaml", base_yaml((tmp_root() / "nodata").string(), "fp32"));
  const Cmd r = train_cmd("--config " + path + " --set data.train_path=/nonexistent/shakespeare.txt");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("data.train_path"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/shakespeare.txt"), std::string::npos) << r.err;
  std::printf("  %s", r.err.c_str());
}

TEST(TrainBadInput, ExistingRunDirectoryIsNotOverwritten) {
  const std::string dir = (tmp_root() / "exists").string();
  const std::string path = write_yaml("exists.yaml", base_yaml(dir, "fp32"));
  ASSERT_EQ(train_cmd("--config " + path + " --set train.max_steps=5").code, 0);
  const std::string metrics = slurp(dir + "/metrics.jsonl");
  const std::string ckpt = slurp(latest_checkpoint(dir));
  const Cmd r = train_cmd("--config " + path);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--overwrite"), std::string::npos) << r.err;
  EXPECT_EQ(metrics, slurp(dir + "/metrics.jsonl"));
  EXPECT_EQ(ckpt, slurp(latest_checkpoint(dir)));
  std::printf("  %s", r.err.c_str());
  EXPECT_EQ(train_cmd("--config " + path + " --overwrite --set train.max_steps=5").code, 0);
}

// A run whose memory estimate exceeds the machine's available memory is refused before
// anything is allocated or written: one line naming the config file and the keys to
// change, a non-zero exit, and an existing run directory untouched even with --overwrite.
TEST(TrainBadInput, RunThatCannotFitInMemoryIsRefusedBeforeTouchingTheRunDir) {
  const std::string dir = (tmp_root() / "toobig").string();
  const std::string path = write_yaml("toobig.yaml", base_yaml(dir, "fp32"));
  ASSERT_EQ(train_cmd("--config " + path + " --set train.max_steps=5").code, 0);
  const std::string metrics = slurp(dir + "/metrics.jsonl");
  const std::string log = slurp(dir + "/train.log");
  const std::string ckpt = slurp(latest_checkpoint(dir));
  // ~600 GB of activations: 4096 sequences of 1024 tokens through 4 layers of width 512
  // (within the config's own bound on values, train/config.cpp).
  const Cmd r = train_cmd("--config " + path + " --overwrite --set model.n_layer=4 "
                          "--set model.n_head=8 --set model.n_embd=512 "
                          "--set model.max_seq_len=1024 --set train.seq_len=1024 "
                          "--set train.batch_size=4096");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const char* s : {"toobig.yaml", "train.batch_size 4096", "train.seq_len 1024",
                        "train.grad_accum_steps", "available"})
    EXPECT_NE(r.err.find(s), std::string::npos) << s << " in " << r.err;
  EXPECT_EQ(metrics, slurp(dir + "/metrics.jsonl"));
  EXPECT_EQ(log, slurp(dir + "/train.log"));
  EXPECT_EQ(ckpt, slurp(latest_checkpoint(dir)));
  std::printf("  %s", r.err.c_str());
}

TEST(TrainBadInput, TruncatedAndCorruptCheckpointsAreRefused) {
  const std::string dir = (tmp_root() / "corrupt").string();
  const std::string path = write_yaml("corrupt.yaml", base_yaml(dir, "fp32"));
  ASSERT_EQ(train_cmd("--config " + path + " --stop-after 5").code, 0);
  const std::string ck = latest_checkpoint(dir);
  const std::string good = slurp(ck);
  {
    std::ofstream(ck, std::ios::binary) << good.substr(0, good.size() / 2);
    const Cmd r = train_cmd("--config " + path + " --resume");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(ck), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
    EXPECT_EQ(slurp(ck).size(), good.size() / 2) << "the refused checkpoint was modified";
    std::printf("  %s", r.err.c_str());
  }
  {
    std::string bad = good;
    bad[bad.size() / 2] ^= 0x40;
    std::ofstream(ck, std::ios::binary) << bad;
    const Cmd r = train_cmd("--config " + path + " --resume");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(ck), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("corrupt"), std::string::npos) << r.err;
    EXPECT_EQ(slurp(ck), bad);
    std::printf("  %s", r.err.c_str());
  }
}

TEST(TrainBadInput, NanLossStopsAndKeepsLastGoodCheckpoint) {
  // FP16 with an absurd learning rate and no clipping: after one update the activations
  // overflow FP16 and the loss becomes NaN.
  const std::string dir = (tmp_root() / "nan").string();
  const std::string path = write_yaml("nan.yaml", base_yaml(dir, "fp16"));
  const Cmd r = train_cmd("--config " + path +
                          " --set train.lr=10 --set train.min_lr=10 --set train.warmup_steps=0"
                          " --set train.grad_clip=0 --set train.ckpt_every=1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("loss is"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("last good checkpoint"), std::string::npos) << r.err;
  std::printf("  %s", r.err.c_str());
  const std::string ck = latest_checkpoint(dir);
  ASSERT_FALSE(ck.empty());
  const CheckpointState s = load_checkpoint(ck);  // intact: loads and verifies
  EXPECT_NE(r.err.find(ck), std::string::npos) << "error does not name " << ck;
  EXPECT_GE(s.step, 1);
}


// device: cuda where no GPU can be used (this test runs in the CPU suite): one clear line,
// nothing written.
TEST(TrainBadInput, CudaWithoutAGpuIsRefusedLoudly) {
  const std::string path =
      write_yaml("nogpu.yaml", base_yaml((tmp_root() / "nogpu").string(), "fp32"));
  const Cmd r = train_cmd("--config " + path + " --set device=cuda");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(r.err.find("no CUDA device is available") != std::string::npos ||
              r.err.find("this build has no CUDA backend") != std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(tmp_root() / "nogpu")) << "a refused run left a run directory";
}
