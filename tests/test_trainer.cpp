// The trainer end to end on a tiny model: determinism, exact resume in FP32/BF16/FP16, and
// every class of bad input through the real `train` binary (error text, exit code, and that
// nothing existing was overwritten).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include "test_util.h"
#include "backends/backends.h"
#include "backends/cpu_threads.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/checkpoint.h"
#include "train/config.h"
#include "train/hooks.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace st;

using st::test::slurp;

namespace {

const fs::path& tmp_root() {
  static const fs::path p = st::test::make_scratch_dir("st_trainer_test_");
  return p;
}

// A deterministic pseudo-text of ~40 KB (words from a small vocabulary).
std::string text_file() { return st::test::pseudo_text_file(tmp_root() / "text.txt"); }

std::string base_yaml(const std::string& out_dir, const std::string& prec) {
  std::ostringstream y;
  y << "run: {name: t, out_dir: '" << out_dir << "', seed: 7}\n"
    << "model: {n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 16, vocab_size: 256}\n"
    << "data: {train_path: '" << text_file() << "', tokenizer: byte, val_fraction: 0.1}\n"
    << "train: {max_steps: 20, batch_size: 4, seq_len: 16, grad_accum_steps: 2, lr: 3.0e-3,"
    << " min_lr: 3.0e-4, warmup_steps: 3, ckpt_every: 5, keep_checkpoints: 0, eval_every: 10,"
    << " eval_batches: 2, log_every: 5, sample_tokens: 0}\n"
    << "precision: {compute: " << prec << ", loss_scale_init: 1024}\n"
    << "device: cpu\n";
  return y.str();
}

Config config(const std::string& name, const std::string& prec) {
  return parse_config(base_yaml((tmp_root() / name).string(), prec), name + ".yaml");
}

TrainOptions quiet() {
  TrainOptions o;
  o.console = false;
  return o;
}


struct Cmd {
  int code;
  std::string err;
};

// Runs the train binary; returns its exit code and stderr.
Cmd train_cmd(const std::string& args) {
  const fs::path err = tmp_root() / "stderr.txt";
  const std::string cmd = std::string(ST_TRAIN_BIN) + " " + args + " >/dev/null 2>" + err.string();
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(err)};
}

std::string write_yaml(const std::string& name, const std::string& text) {
  const fs::path p = tmp_root() / name;
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

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

// Checksum-valid checkpoints whose records change the arithmetic of the run resuming from
// them (the probe: a bf16 compute record resumed an fp32 run in silence, as did a
// non-UTF-8 config_yaml, a loss scale of 1e-45 and a step of 2^62): each refused with one
// line naming the field and the fix, exit 1, the checkpoint and the logs as they were.
TEST(TrainResume, CheckpointOfOtherArithmeticIsRefused) {
  const std::string dir = (tmp_root() / "arith").string();
  const std::string path = write_yaml("arith.yaml", base_yaml(dir, "fp32"));
  ASSERT_EQ(train_cmd("--config " + path + " --stop-after 5").code, 0);
  const std::string ck = dir + "/ckpt_00000005.bin";
  const std::string good_bytes = slurp(ck), metrics = slurp(dir + "/metrics.jsonl");
  const CheckpointState good = load_checkpoint(ck);
  auto replace = [](std::string t, const std::string& from, const std::string& to) {
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  const struct {
    const char* what;
    std::function<void(CheckpointState&)> edit;
    std::vector<std::string> want;
  } cases[] = {
      {"compute record bf16", [](auto& s) { s.compute = "bf16"; },
       {"config_yaml says precision.compute: 'fp32' but the record compute is 'bf16'"}},
      {"compute record and config_yaml bf16",
       [&](auto& s) {
         s.compute = "bf16";
         s.config_yaml = replace(s.config_yaml, "compute: fp32", "compute: bf16");
       },
       {"precision.compute is 'fp32' but the checkpoint", "holds 'bf16' training state",
        "resume with the run's own config.yaml"}},
      {"non-UTF-8 config_yaml",
       [&](auto& s) { s.config_yaml = replace(s.config_yaml, "name: t", "name: t\xff\xfe"); },
       {"config_yaml holds 2 bytes that are not UTF-8"}},
      {"loss scale 1e-45", [](auto& s) { s.loss_scale = 1e-45f; },
       {"loss_scale = 1.4013e-45", "with compute fp32, expected 1 and 0"}},
      {"step 2^62", [](auto& s) { s.step = int64_t(1) << 62; },
       {"step = 4611686018427387904, expected 0..99999999"}},
      {"step 7 in ckpt_00000005.bin", [](auto& s) { s.step = 7; },
       {"holds step 7 but its name says step 00000005", "rename it to ckpt_00000007.bin"}},
      {"padded vocabulary 384", [](auto& s) { s.padded_vocab_size = 384; },
       {"master holds"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    CheckpointState s = good;
    c.edit(s);
    save_checkpoint(ck, s);
    const std::string bytes = slurp(ck);
    const Cmd r = train_cmd("--config " + path + " --resume");
    EXPECT_EQ(r.code, 1) << r.err;
    for (const auto& w : c.want) EXPECT_NE(r.err.find(w), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(ck), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
    EXPECT_EQ(slurp(ck), bytes);
    EXPECT_EQ(slurp(dir + "/metrics.jsonl"), metrics);
    std::printf("  %-36s -> %s", c.what, r.err.c_str());
  }
  save_checkpoint(ck, good);
  ASSERT_EQ(slurp(ck), good_bytes);

  // A change meant to be allowed (here train.lr) is said in train.log and as one
  // config_change record in metrics.jsonl at the resumed step, once however often that
  // checkpoint is resumed.
  for (int again = 0; again < 2; ++again) {
    const Cmd r = train_cmd("--config " + path + " --resume --stop-after 7 --set train.lr=1e-3");
    ASSERT_EQ(r.code, 0) << r.err;
    fs::remove(dir + "/ckpt_00000007.bin");  // the next resume starts from step 5 again
  }
  EXPECT_NE(slurp(dir + "/train.log").find("resume: train.lr changed from '0.003' to '0.001'"),
            std::string::npos);
  int records = 0;
  std::ifstream f(dir + "/metrics.jsonl");
  for (std::string l; std::getline(f, l);) {
    const auto j = nlohmann::json::parse(l);
    if (j.value("kind", "") != "config_change") continue;
    ++records;
    EXPECT_EQ(j.dump(), R"({"from":"0.003","key":"train.lr","kind":"config_change","step":5,"to":"0.001"})");
  }
  EXPECT_EQ(records, 1);
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

class Resume : public ::testing::TestWithParam<const char*> {};

TEST_P(Resume, TwoRunsIdenticalAndResumeIsBitExact) {
  const std::string prec = GetParam();
  const TrainResult a = run_training(config("a_" + prec, prec), quiet());
  const TrainResult b = run_training(config("b_" + prec, prec), quiet());
  ASSERT_EQ(a.losses.size(), 20u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.weights_sha256, b.weights_sha256);
  EXPECT_LT(a.losses.back(), a.losses.front()) << "the loss did not fall";

  TrainOptions first = quiet();
  first.stop_after = 10;
  const TrainResult c1 = run_training(config("c_" + prec, prec), first);
  TrainOptions again = quiet();
  again.resume = true;
  const TrainResult c2 = run_training(config("c_" + prec, prec), again);
  EXPECT_EQ(c1.last_step, 10);
  EXPECT_EQ(c2.first_step, 10);
  std::vector<float> joined = c1.losses;
  joined.insert(joined.end(), c2.losses.begin(), c2.losses.end());
  EXPECT_EQ(joined, a.losses) << "10 + resume + 10 differs from 20 straight";
  EXPECT_EQ(c2.weights_sha256, a.weights_sha256);
  EXPECT_EQ(c2.val_loss, a.val_loss);
  // metrics.jsonl holds each step once, with values identical to the straight run's file
  // (all but the timing fields).
  auto steps = [](const std::string& dir) {
    std::vector<std::string> lines;
    std::ifstream f(dir + "/metrics.jsonl");
    for (std::string l; std::getline(f, l);) {
      auto j = nlohmann::json::parse(l);
      if (!j.contains("loss")) continue;
      j.erase("elapsed");
      j.erase("tokens_per_s");
      lines.push_back(j.dump());
    }
    return lines;
  };
  const auto la = steps((tmp_root() / ("a_" + prec)).string());
  const auto lc = steps((tmp_root() / ("c_" + prec)).string());
  EXPECT_EQ(la.size(), 20u);
  EXPECT_EQ(la, lc);
  // Every line's first key is its kind, one kind per record type (pandas: df.kind).
  std::map<std::string, int> kinds;
  std::ifstream f(tmp_root() / ("c_" + prec) / "metrics.jsonl");
  for (std::string l; std::getline(f, l);) {
    const auto j = nlohmann::ordered_json::parse(l);
    ASSERT_EQ(j.begin().key(), "kind") << l;
    const std::string kind = j["kind"];
    ++kinds[kind];
    EXPECT_EQ(kind, j.contains("loss")         ? "train"
                    : j.contains("val_loss")   ? "eval"
                    : j.contains("checkpoint") ? "checkpoint"
                                               : "?")
        << l;
  }
  // 20 steps, evaluations at 10 and 20, checkpoints at 5, 10, 15, 20.
  EXPECT_EQ(kinds, (std::map<std::string, int>{{"train", 20}, {"eval", 2}, {"checkpoint", 4}}));
}

INSTANTIATE_TEST_SUITE_P(Precisions, Resume, ::testing::Values("fp32", "bf16", "fp16"));

// Two identical runs write byte-identical checkpoints (no uninitialised padding, no wall
// time in the file). The second run goes into the same directory (the config names it)
// after the first one's is moved away.
TEST(TrainDeterminism, IdenticalRunsWriteByteIdenticalCheckpoints) {
  const fs::path dir = tmp_root() / "same_ckpt", first = tmp_root() / "same_ckpt_first";
  TrainOptions o = quiet();
  o.stop_after = 5;
  run_training(config("same_ckpt", "fp32"), o);
  fs::rename(dir, first);
  run_training(config("same_ckpt", "fp32"), o);
  int compared = 0;
  for (const auto& e : fs::directory_iterator(first)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt_", 0) != 0) continue;
    ASSERT_TRUE(fs::exists(dir / name)) << name;
    EXPECT_TRUE(slurp(e.path()) == slurp(dir / name)) << name << " differs between the runs";
    ++compared;
  }
  EXPECT_GE(compared, 1);
}

// Every CPU kernel gives the same bits for any thread count (layers/matmul_cpu.cpp tiles
// the GEMMs on a fixed grid), so run.threads 1, 3 and auto (which switches counts while it
// measures) train identically. n_embd 96 makes the MLP's GEMMs span two 256-wide tiles.
TEST(TrainDeterminism, ThreadCountChangesNoBit) {
  std::vector<TrainResult> r;
  for (const char* threads : {"1", "3", "auto"}) {
    const std::string name = std::string("threads_") + threads;
    std::string y = base_yaml((tmp_root() / name).string(), "bf16");
    y.replace(y.find("n_embd: 32"), 10, "n_embd: 96");
    y.replace(y.find("seed: 7}"), 8, std::string("seed: 7, threads: ") + threads + "}");
    TrainOptions o = quiet();
    o.stop_after = 12;
    r.push_back(run_training(parse_config(y, name + ".yaml"), o));
  }
  ASSERT_EQ(r[0].losses.size(), 12u);
  for (size_t i = 1; i < r.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r[i].losses, r[0].losses);
    EXPECT_EQ(r[i].weights_sha256, r[0].weights_sha256);
  }
  const std::string log = slurp(tmp_root() / "threads_auto" / "train.log");
  EXPECT_NE(log.find("cpu: auto (the fastest of"), std::string::npos) << log;
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

// --resume of a run that reached train.max_steps runs nothing: one line on stdout naming
// the step and the checkpoint, exit status 0, and every file of the run directory (the
// lock file included) the same, by SHA-256, as before; no file added or removed.
TEST(TrainResume, FinishedRunHasNothingToDoAndTouchesNothing) {
  const std::string dir = (tmp_root() / "finished").string();
  const std::string path = write_yaml("finished.yaml", base_yaml(dir, "fp32"));
  ASSERT_EQ(train_cmd("--config " + path + " --set train.max_steps=6").code, 0);
  auto digests = [&] {
    std::map<std::string, std::string> m;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string b = slurp(e.path());
      m[e.path().filename().string()] = sha256_hex(b.data(), b.size());
    }
    return m;
  };
  const auto before = digests();
  ASSERT_TRUE(before.count("metrics.jsonl") && before.count("train.log") &&
              before.count("ckpt_00000006.bin") && before.count("train.lock"));
  const fs::path out = tmp_root() / "finished_stdout.txt";
  const std::string cmd = std::string(ST_TRAIN_BIN) + " --config " + dir + "/config.yaml" +
                          " --resume >" + out.string() + " 2>&1";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  EXPECT_EQ(slurp(out),
            "nothing to do: run finished at step 6 (" + dir + "/ckpt_00000006.bin)\n");
  EXPECT_EQ(digests(), before);
  // --stop-after at the step already reached: the same, through the library.
  TrainOptions o = quiet();
  o.resume = true;
  o.stop_after = 6;
  Config c = parse_config(base_yaml(dir, "fp32"), "finished.yaml");
  const TrainResult r = run_training(c, o);
  EXPECT_EQ(r.last_step, 6);
  EXPECT_TRUE(r.losses.empty());
  EXPECT_EQ(r.nothing_to_do,
            "nothing to do: run at step 6 (" + dir + "/ckpt_00000006.bin), --stop-after 6");
  EXPECT_EQ(digests(), before);
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

// train.log says before the first step what the run will hold in memory, and once the
// steps are measured (STABLETRAIN_TIMING_AFTER_S=0: no 10 s wait) their time and the ETA.
TEST(TrainLog, MemoryEstimateBeforeTheFirstStepAndOneTimingLine) {
  const std::string dir = (tmp_root() / "timing").string();
  const std::string path = write_yaml("timing.yaml", base_yaml(dir, "bf16"));
  // One thread: no run.threads auto probe steps (TimingLineLeavesOutThreadProbes has them).
  const std::string cmd = "STABLETRAIN_TIMING_AFTER_S=0 " + std::string(ST_TRAIN_BIN) +
                          " --config " + path +
                          " --set train.log_every=1 --set run.threads=1 >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string log = slurp(dir + "/train.log");
  const size_t mem = log.find("memory estimate: "), step1 = log.find("step      1/");
  ASSERT_NE(mem, std::string::npos) << log;
  ASSERT_NE(step1, std::string::npos) << log;
  EXPECT_LT(mem, step1);
  for (const char* s : {"parameters ", "gradients ", "FP32 master weights ", "AdamW m and v ",
                        "activations (4 x 16) ", "largest transient", "available "})
    EXPECT_NE(log.find(s, mem), std::string::npos) << s;
  const size_t t = log.find("timing: ");
  ASSERT_NE(t, std::string::npos) << log;
  EXPECT_EQ(log.find("timing: ", t + 1), std::string::npos);  // once
  // Steps 1-2 are warm-up; step 5, a checkpoint step, is a hook step (hooks.every 100 runs
  // them at checkpoints too) and is not measured: steps 3, 4 and 6, of 20.
  const std::string line = log.substr(t, log.find('\n', t) - t);
  EXPECT_NE(line.find("over steps 3-6 (3 steps); 14 steps left -> ETA "), std::string::npos)
      << line;
  EXPECT_LT(log.find("step      6/"), t);
  EXPECT_LT(t, log.find("step      7/"));
}

// data.prepare_from writing the shards: each line on the console once, as it happens, and
// once in train.log (the console had every line twice); a resume, with the shards there,
// prepares nothing and says which data it reads once.
TEST(TrainLog, DataPreparationLinesOnceOnConsoleAndInLog) {
  const std::string dir = (tmp_root() / "prep").string();
  const std::string cache = (tmp_root() / "prep_cache").string();
  std::string y = base_yaml(dir, "fp32");
  const size_t d = y.find("data: {"), e = y.find('\n', d);
  y.replace(d, e - d, "data: {train_path: '" + cache + "/t_train_*.bin', val_path: '" + cache +
                          "/t_val_*.bin', prepare_from: '" + text_file() +
                          "', tokenizer: byte, val_fraction: 0.1}");
  const std::string path = write_yaml("prep.yaml", y);
  const fs::path out = tmp_root() / "prep_stdout.txt";
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string(ST_TRAIN_BIN) + " --config " + path + " " + args + " >" +
                            out.string() + " 2>&1";
    return std::system(cmd.c_str());
  };
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
  };
  ASSERT_EQ(run("--stop-after 1"), 0) << slurp(out);
  const std::string console = slurp(out), log = slurp(dir + "/train.log");
  // (" tokens from ": the train and the validation split's lines.)
  const std::pair<const char*, size_t> lines[] = {
      {"preparing ", 1}, {"input:", 1},           {"tokenizer:", 1},
      {" tokens from ", 2}, {"time:", 1},         {"memory estimate: ", 1}};
  for (const auto& [s, want] : lines) {
    EXPECT_EQ(count(console, s), want) << s << " in\n" << console;
    EXPECT_EQ(count(log, s), want) << s << " in\n" << log;
  }
  // Every data line (the description too) as often on the console as in train.log.
  EXPECT_EQ(count(console, "data: "), count(log, "data: ")) << console;
  EXPECT_GE(count(log, "data: "), 7u) << log;
  ASSERT_EQ(run("--resume --stop-after 2"), 0) << slurp(out);
  const std::string again = slurp(out);
  EXPECT_EQ(count(again, "data: preparing "), 0u) << again;
  EXPECT_EQ(count(again, "data: "), 1u) << again;
}

// With run.threads auto the steps that try thread counts run at counts the run may not
// keep: the timing line starts after the step that reports the choice.
TEST(TrainLog, TimingLineLeavesOutThreadProbes) {
  if (cpu_cores_available() < 2) GTEST_SKIP() << "one core: run.threads auto has nothing to try";
  const std::string dir = (tmp_root() / "timing_auto").string();
  const std::string path = write_yaml("timing_auto.yaml", base_yaml(dir, "fp32"));
  const std::string cmd = "STABLETRAIN_TIMING_AFTER_S=0 " + std::string(ST_TRAIN_BIN) +
                          " --config " + path +
                          " --set run.threads=auto --set hooks.every=0 >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string log = slurp(dir + "/train.log");
  const size_t a = log.find("run.threads auto: "), t = log.find("timing: ");
  ASSERT_NE(a, std::string::npos) << log;
  ASSERT_NE(t, std::string::npos) << log;
  // "... step 6: run.threads auto: 2 threads (...)" and "timing: ... over steps 7-9 ...".
  const size_t sp = log.rfind("step ", a);
  ASSERT_NE(sp, std::string::npos);
  const int chosen_at = std::atoi(log.c_str() + sp + 5);
  const size_t over = log.find("over steps ", t);
  ASSERT_NE(over, std::string::npos) << log.substr(t, 200);
  const int from = std::atoi(log.c_str() + over + 11);
  EXPECT_GT(chosen_at, 2) << log.substr(sp, 120);
  EXPECT_GT(from, chosen_at) << log.substr(t, 200);
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

TEST(TrainConfig, PerLayerBackendsAndFp32Heads) {
  Config c = config("perlayer", "bf16");  // 2 layers, 2 heads
  c.attention.layer_backends = "1:stabilized_flash";
  c.attention.fp32_out_heads = "0.1, 1.0";
  c.attention.accum = "bf16";
  const auto layers = attention_configs(c);
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].kind, AttentionKind::Baseline);
  EXPECT_EQ(layers[1].kind, AttentionKind::StabilizedFlash);
  EXPECT_EQ(layers[0].fp32_out_heads, std::vector<int>{1});
  EXPECT_EQ(layers[1].fp32_out_heads, std::vector<int>{0});
  EXPECT_EQ(layers[1].numerics(DType::BF16, 0).out, DType::F32);
  EXPECT_EQ(layers[1].numerics(DType::BF16, 1).out, DType::BF16);
  EXPECT_EQ(layers[1].numerics(DType::BF16, 1).accum, DType::BF16);
  for (const auto& [key, bad] : std::vector<std::pair<std::string, std::string>>{
           {"layer_backends", "2:flash"}, {"layer_backends", "1=flash"},
           {"layer_backends", "0:flashy"}, {"fp32_out_heads", "0.2"}, {"fp32_out_heads", "x.1"}}) {
    Config b = c;
    (key == "layer_backends" ? b.attention.layer_backends : b.attention.fp32_out_heads) = bad;
    try {
      attention_configs(b);
      ADD_FAILURE() << key << "='" << bad << "' was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("perlayer.yaml"), std::string::npos) << msg;
      std::printf("  %-28s -> %s\n", (key + "=" + bad).c_str(), msg.c_str());
    }
  }
}
