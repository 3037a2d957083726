// The trainer end to end on a tiny model: determinism (byte-identical checkpoints, any
// thread count), exact resume in FP32/BF16/FP16, checkpoints of other arithmetic refused on
// resume, a finished run left alone, what train.log says, per-layer backends. (Bad input:
// test_trainer.cpp; the shared harness: trainer_fixture.h.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "backends/backends.h"
#include "backends/cpu_threads.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/checkpoint.h"
#include "trainer_fixture.h"

using namespace st::trainer_test;

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
