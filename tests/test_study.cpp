// study (apps/study.cpp, docs/studies.md) end to end on the real binaries: a study of 3
// attention backends x 2 seeds on a tiny byte-level model (8 steps a run, well under a
// second each) gives 6 run directories with the same checkpoint steps, compare.csv and
// report.html; a second invocation skips every run and changes no run file; a run left
// half done by `train --stop-after` is resumed to the same weights as an uninterrupted one;
// a changed study is refused on the existing runs; bad study files give one-line errors
// naming the file and the key and start nothing; a failing run stops the study naming it;
// Ctrl-C stops the running train with a checkpoint and the same command resumes it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "report_page.h"
#include "test_util.h"

namespace fs = std::filesystem;
using st::test::slurp;

namespace {

const fs::path& tmp_root() { return st::test::scratch_root("st_study_test_"); }

using st::test::Cmd;
Cmd run_cmd(const std::string& cmd) { return st::test::run_cmd(cmd, tmp_root()); }

Cmd study(const std::string& args) { return run_cmd(std::string(ST_STUDY_BIN) + " " + args); }

// The base config: 1 layer, width 16, 8 steps of 2 x 16 bytes, hooks at 4 and 8.
const fs::path& base_config() {
  static const fs::path p = [] {
    const fs::path cfg = tmp_root() / "base.yaml";
    std::ofstream(cfg)
        << "run: {name: t, out_dir: unused, seed: 7, threads: 1}\n"
        << "model: {n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 16, vocab_size: 256}\n"
        << "data: {train_path: '" ST_SHARED_DATA_DIR "/tinyshakespeare.txt', tokenizer: byte,"
        << " val_fraction: 0.1}\n"
        << "train: {max_steps: 8, batch_size: 2, seq_len: 16, lr: 3.0e-3, min_lr: 3.0e-4,"
        << " warmup_steps: 2, eval_every: 4, eval_batches: 1, log_every: 4, sample_tokens: 0}\n"
        << "hooks: {every: 4}\n"
        << "device: cpu\n";
    return cfg;
  }();
  return p;
}

// A study file in the scratch folder; `body` follows the base: line.
fs::path study_file(const std::string& name, const std::string& body) {
  const fs::path p = tmp_root() / name;
  std::ofstream(p) << "base: " << base_config().string() << "\n" << body;
  return p;
}

// The study under test: backends x seeds in BF16, 2 checkpoints a run (train.ckpt_every 4).
const std::string kBody =
    "set:\n"
    "  precision.compute: bf16\n"
    "axes:\n"
    "  attention.backend: [baseline, flash, stabilized_flash]\n"
    "  run.seed: [1, 2]\n"
    "checkpoints: 2\n";

const std::vector<std::string> kRuns = {
    "backend-baseline_seed-1",         "backend-baseline_seed-2",
    "backend-flash_seed-1",            "backend-flash_seed-2",
    "backend-stabilized_flash_seed-1", "backend-stabilized_flash_seed-2"};

// Every file under `dir` (relative path -> SHA-256 of its bytes).
std::map<std::string, std::string> hashes(const fs::path& dir) {
  std::map<std::string, std::string> h;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) {
      const std::string b = slurp(e.path());
      h[fs::relative(e.path(), dir).string()] = st::sha256_hex(b.data(), b.size());
    }
  return h;
}

// step -> weights_sha256 of the checkpoint lines of a run's metrics.jsonl.
std::map<int, std::string> checkpoint_lines(const fs::path& run) {
  std::map<int, std::string> m;
  std::ifstream f(run / "metrics.jsonl");
  static const std::regex re("\"step\":([0-9]+),\"checkpoint\":\"[^\"]*\",\"weights_sha256\":\"([0-9a-f]+)\"");
  for (std::string line; std::getline(f, line);) {
    std::smatch sm;
    if (std::regex_search(line, sm, re)) m[std::stoi(sm[1])] = sm[2];
  }
  return m;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The whole study once per test process (about 1-2 s on 2 cores); its output folder.
const fs::path& full_study() {
  static const fs::path out = [] {
    const fs::path o = tmp_root() / "full";
    const Cmd c = study(study_file("study.yaml", kBody).string() + " --out " + o.string());
    EXPECT_EQ(c.code, 0) << c.out << c.err;
    std::ofstream(tmp_root() / "full_console.txt") << c.out;
    return o;
  }();
  return out;
}

TEST(Study, RunsEveryRunWithAlignedCheckpointsThenCompareAndReport) {
  const fs::path& out = full_study();
  const std::string console = slurp(tmp_root() / "full_console.txt");
  for (size_t i = 0; i < kRuns.size(); ++i) {
    SCOPED_TRACE(kRuns[i]);
    EXPECT_NE(console.find("study: run " + std::to_string(i + 1) + "/6 " + kRuns[i] + "\n"),
              std::string::npos)
        << console;
    // Checkpoints at the same steps, every one kept (train.keep_checkpoints 0).
    const auto ck = checkpoint_lines(out / kRuns[i]);
    EXPECT_EQ(ck.size(), 2u);
    EXPECT_TRUE(ck.count(4) && ck.count(8));
    EXPECT_TRUE(fs::exists(out / kRuns[i] / "ckpt_00000004.bin"));
    EXPECT_TRUE(fs::exists(out / kRuns[i] / "ckpt_00000008.bin"));
    // run.name and the overrides reached the run's config.
    const std::string cfg = slurp(out / kRuns[i] / "config.yaml");
    EXPECT_NE(cfg.find("name: " + kRuns[i]), std::string::npos);
    EXPECT_NE(cfg.find("ckpt_every: 4 "), std::string::npos);
    EXPECT_NE(cfg.find("compute: bf16"), std::string::npos);
  }
  EXPECT_NE(slurp(out / kRuns[2] / "config.yaml").find("backend: flash "), std::string::npos);
  EXPECT_NE(slurp(out / kRuns[1] / "config.yaml").find("seed: 2"), std::string::npos);
  // Seeds and backends give different weights; the runs are distinct runs.
  EXPECT_NE(checkpoint_lines(out / kRuns[0])[8], checkpoint_lines(out / kRuns[1])[8]);
  EXPECT_NE(checkpoint_lines(out / kRuns[0])[8], checkpoint_lines(out / kRuns[2])[8]);

  // compare: the reference (the first run) against each of the other 5 at both steps.
  const std::string csv = slurp(out / "compare.csv");
  ASSERT_FALSE(csv.empty());
  EXPECT_EQ(csv.rfind("run_a,run_b,step,", 0), 0u);
  for (size_t i = 1; i < kRuns.size(); ++i) {
    EXPECT_GT(count(csv, "\n" + kRuns[0] + "," + kRuns[i] + ",4,"), 0) << kRuns[i];
    EXPECT_GT(count(csv, "\n" + kRuns[0] + "," + kRuns[i] + ",8,"), 0) << kRuns[i];
  }
  EXPECT_TRUE(fs::exists(out / "compare_loss.csv"));
  // The report: the 6 runs, the reference first, every other run's weights against it at
  // both checkpoint steps; drawn by headless Chromium without an error, every per-layer
  // panel overlaying the runs (the 1-layer, 2-head model: heads x runs per panel).
  const nlohmann::json page = st::test::page_data(slurp(out / "report.html"));
  ASSERT_TRUE(page.is_object()) << "report.html has no data document";
  ASSERT_EQ(page["runs"].size(), kRuns.size());
  for (size_t i = 0; i < kRuns.size(); ++i) EXPECT_EQ(page["runs"][i]["name"], kRuns[i]);
  EXPECT_EQ(page["reference"], 0);
  ASSERT_EQ(page["distance"].size(), kRuns.size() - 1);
  for (const auto& d : page["distance"]) {
    EXPECT_EQ(d["against"], 0);
    EXPECT_EQ(d["pairs"], nlohmann::json::parse(R"([{"a":4,"b":4},{"a":8,"b":8}])"));
  }
  const st::test::Render shot = st::test::render_page(out / "report.html", "study_report.png", tmp_root());
  st::test::expect_clean(shot);
  EXPECT_EQ(shot.panels.at("loss"), 12) << st::test::dump_panels(shot.panels);  // 6 runs' loss and val loss
  EXPECT_EQ(shot.panels.at("dloss"), 5);
  EXPECT_EQ(shot.panels.at("grad:L0"), 6);
  EXPECT_EQ(shot.panels.at("spectral:wq:L0"), 12);
  EXPECT_EQ(shot.panels.at("attention:max_logit:L0"), 12);
  EXPECT_EQ(shot.panels.at("distance:w1n:qkvw:L0"), 5);
  EXPECT_NE(console.find("study: done: 6 runs in " + out.string() + " (6 trained, 0 resumed, 0 skipped)"),
            std::string::npos)
      << console;

  // OUT/study.yaml lists every run with its overrides and is itself a study file: a dry run
  // of it finds every run finished.
  const std::string resolved = slurp(out / "study.yaml");
  for (const auto& r : kRuns) EXPECT_NE(resolved.find("- name: " + r + "\n"), std::string::npos);
  EXPECT_NE(resolved.find("attention.backend: \"stabilized_flash\""), std::string::npos);
  const Cmd dry = study((out / "study.yaml").string() + " --dry-run");
  EXPECT_EQ(dry.code, 0) << dry.err;
  EXPECT_EQ(count(dry.out, ": finished\n"), 6) << dry.out;
}

TEST(Study, SecondInvocationSkipsEveryRunAndChangesNoRunFile) {
  const fs::path& out = full_study();
  std::map<std::string, std::map<std::string, std::string>> before;
  for (const auto& r : kRuns) before[r] = hashes(out / r);
  const Cmd c = study((tmp_root() / "study.yaml").string() + " --out " + out.string());
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  for (size_t i = 0; i < kRuns.size(); ++i)
    EXPECT_NE(c.out.find("study: run " + std::to_string(i + 1) + "/6 " + kRuns[i] +
                         ": finished (step 8 checkpoint in metrics.jsonl), skipped\n"),
              std::string::npos)
        << c.out;
  EXPECT_EQ(c.out.find("stabletrain:"), std::string::npos) << "train ran:\n" << c.out;
  EXPECT_NE(c.out.find("(0 trained, 0 resumed, 6 skipped)"), std::string::npos) << c.out;
  for (const auto& r : kRuns) EXPECT_EQ(hashes(out / r), before[r]) << r;
  EXPECT_TRUE(fs::exists(out / "report.html"));
}

TEST(Study, ResumesARunLeftHalfDone) {
  const fs::path out = tmp_root() / "partial";
  const std::string last = kRuns.back();
  // The last run, as the study would start it (docs/studies.md lists the overrides), stopped
  // after step 4's checkpoint.
  const Cmd t = run_cmd(std::string(ST_TRAIN_BIN) + " --config " + base_config().string() +
                        " --set precision.compute=bf16 --set attention.backend=stabilized_flash"
                        " --set run.seed=2 --set run.out_dir=" + (out / last).string() +
                        " --set run.name=" + last +
                        " --set train.ckpt_every=4 --set train.keep_checkpoints=0 --stop-after 4");
  ASSERT_EQ(t.code, 0) << t.err;
  ASSERT_EQ(checkpoint_lines(out / last).size(), 1u);

  const fs::path file = study_file("study.yaml", kBody);
  const Cmd dry = study(file.string() + " --out " + out.string() + " --dry-run");
  EXPECT_EQ(dry.code, 0) << dry.err;
  EXPECT_NE(dry.out.find("run 6/6 " + last + ": to resume from ckpt_00000004.bin\n"), std::string::npos)
      << dry.out;
  EXPECT_EQ(count(dry.out, ": to train\n"), 5) << dry.out;

  const Cmd c = study(file.string() + " --out " + out.string());
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  EXPECT_NE(c.out.find("study: run 6/6 " + last + ": resuming from ckpt_00000004.bin\n"),
            std::string::npos)
      << c.out;
  EXPECT_NE(c.out.find("(5 trained, 1 resumed, 0 skipped)"), std::string::npos) << c.out;
  // Bit for bit the uninterrupted run's weights at both checkpoints.
  EXPECT_EQ(checkpoint_lines(out / last), checkpoint_lines(full_study() / last));
  EXPECT_TRUE(fs::exists(out / "compare.csv"));
  EXPECT_TRUE(fs::exists(out / "report.html"));
}

TEST(Study, RefusesRunsTrainedWithADifferentConfig) {
  const fs::path& out = full_study();
  std::map<std::string, std::string> before = hashes(out / kRuns[0]);
  const fs::path file = study_file("changed.yaml", "set:\n  precision.compute: bf16\n  train.lr: 2.0e-3\n"
                                                   "axes:\n  attention.backend: [baseline, flash, stabilized_flash]\n"
                                                   "  run.seed: [1, 2]\ncheckpoints: 2\n");
  const Cmd c = study(file.string() + " --out " + out.string());
  EXPECT_EQ(c.code, 1);
  EXPECT_EQ(count(c.err, "\n"), 1) << c.err;
  EXPECT_NE(c.err.find("study: error: " + (out / kRuns[0] / "config.yaml").string() + ": run '" + kRuns[0] +
                       "' was trained with train.lr = '0.003' but " + file.string() + " now gives '0.002'"),
            std::string::npos)
      << c.err;
  EXPECT_EQ(c.out.find("study: run "), std::string::npos) << c.out;
  EXPECT_EQ(hashes(out / kRuns[0]), before);
}

TEST(Study, BadStudyFilesGiveOneLineNamingFileAndKeyAndStartNothing) {
  const std::string axes = "axes:\n  run.seed: [1, 2]\n";
  const struct {
    std::string body, expected;
  } cases[] = {
      {axes + "colour: red\n", ":4: unknown key 'colour'"},
      {"axes:\n  attention.backnd: [flash]\n", ":3: axes.attention.backnd: unknown key 'attention.backnd'"
                                               " (did you mean 'attention.backend'?)"},
      {"axes:\n  run.seed: [1, two]\n", ":3: axes.run.seed: run.seed: expected an integer"},
      {"axes:\n  attention.backend: [flash, 3]\n", ":3: axes.attention.backend: attention.backend: expected one of"},
      {"axes:\n  run.seed: []\n", ":3: axes.run.seed: the list of values is empty"},
      {"axes:\n  run.seed: 1\n", ":3: axes.run.seed: expected a list of values"},
      {"axes:\n  run.seed: [1, 1]\n", ":3: axes.run.seed: value '1' is listed twice"},
      {"set: {precision.compute: bf17}\n" + axes, ":2: set.precision.compute: precision.compute: expected one of"},
      {"set: {train.ckpt_every: 3}\n" + axes, ":2: set.train.ckpt_every: train.ckpt_every is set by the study"},
      {"axes:\n  train.seq_len: [64]\n", ":3: axes.train.seq_len: "},
      {axes + "reference: seed-3\n", ":4: reference: 'seed-3' is not a run of the study"},
      {axes + "checkpoints: many\n", ":4: checkpoints: expected an integer"},
      {axes + "runs:\n  - name: x\n    sets: {run.seed: 3}\n", ":6: unknown key 'runs[0].sets'"},
      {axes + "runs:\n  - name: ../x\n", ":5: runs[0].name: '../x' is not a safe directory name"},
      {axes + "report: {max_checkpoints: 1}\n", ":4: report.max_checkpoints = 1 is out of range"},
  };
  const fs::path out = tmp_root() / "never";
  for (const auto& k : cases) {
    SCOPED_TRACE(k.body);
    const fs::path file = study_file("bad.yaml", k.body);
    const Cmd c = study(file.string() + " --out " + out.string());
    EXPECT_EQ(c.code, 1);
    EXPECT_EQ(count(c.err, "\n"), 1) << c.err;
    EXPECT_EQ(c.err.rfind("study: error: " + file.string() + ":", 0), 0u) << c.err;
    EXPECT_NE(c.err.find(k.expected), std::string::npos) << c.err;
    EXPECT_EQ(c.out.find("study: run "), std::string::npos) << c.out;
    EXPECT_FALSE(fs::exists(out));
  }
  // Without base: or with a base that cannot be read.
  std::ofstream(tmp_root() / "nobase.yaml") << axes;
  Cmd c = study((tmp_root() / "nobase.yaml").string() + " --out " + out.string());
  EXPECT_EQ(c.code, 1);
  EXPECT_NE(c.err.find("nobase.yaml: base: is missing"), std::string::npos) << c.err;
  std::ofstream(tmp_root() / "badbase.yaml") << "base: " << (tmp_root() / "none.yaml").string() << "\n" << axes;
  c = study((tmp_root() / "badbase.yaml").string() + " --out " + out.string());
  EXPECT_EQ(c.code, 1);
  EXPECT_NE(c.err.find("badbase.yaml:1: base: cannot read base config"), std::string::npos) << c.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST(Study, AFailingRunStopsTheStudyNamingIt) {
  const fs::path out = tmp_root() / "failing";
  const fs::path file = study_file("failing.yaml",
                                   "checkpoints: 2\nruns:\n  - name: good\n  - name: bad\n"
                                   "    set: {data.train_path: /nonexistent/text.txt}\n  - name: never\n");
  const Cmd c = study(file.string() + " --out " + out.string());
  EXPECT_EQ(c.code, 1);
  EXPECT_NE(c.out.find("study: run 2/3 bad\n"), std::string::npos) << c.out;
  EXPECT_NE(c.err.find("study: error: run 2/3 bad failed (train exit status 1)"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find(out.string() + "/bad/train.log"), std::string::npos) << c.err;
  EXPECT_EQ(c.out.find("run 3/3"), std::string::npos) << c.out;
  EXPECT_FALSE(fs::exists(out / "never"));
  EXPECT_EQ(checkpoint_lines(out / "good").size(), 2u);
}

// jobs: 3 runs at a time give every run the bits it has when the runs train one after another
// (the full study's checkpoint hashes), and the same compare table; the resolved study keeps
// jobs:. A failing run among parallel ones stops the others with a checkpoint (SIGTERM) and
// the study names the failing run.
TEST(Study, JobsTrainRunsAtOnceWithTheBitsOfOneAtATime) {
  const fs::path& seq = full_study();
  const fs::path out = tmp_root() / "jobs";
  const Cmd c = study(study_file("jobs.yaml", kBody + "jobs: 3\n").string() + " --out " + out.string());
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  EXPECT_NE(c.out.find("; 3 at a time\n"), std::string::npos) << c.out;
  for (const auto& r : kRuns) {
    SCOPED_TRACE(r);
    const auto a = checkpoint_lines(seq / r), b = checkpoint_lines(out / r);
    EXPECT_EQ(a.size(), 2u);
    EXPECT_EQ(a, b);
  }
  EXPECT_EQ(slurp(seq / "compare.csv"), slurp(out / "compare.csv"));
  EXPECT_NE(slurp(out / "study.yaml").find("\njobs: 3\n"), std::string::npos);
  // What the one-call GPU study brings back (tools/gpu_check_study.sh's archive: logs, CSVs
  // and configs, no checkpoint) renders here: report --no-checkpoints and repro_summary.
  const fs::path logs = tmp_root() / "jobs_logs_only";
  for (const auto& r : kRuns) {
    fs::create_directories(logs / r);
    for (const auto& e : fs::directory_iterator(out / r)) {
      const std::string n = e.path().filename().string(), ext = e.path().extension().string();
      if (ext == ".jsonl" || ext == ".csv" || ext == ".yaml" || n == "train.log") fs::copy_file(e.path(), logs / r / n);
    }
  }
  const std::string bin = fs::path(ST_STUDY_BIN).parent_path().string();
  const Cmd rep = run_cmd(bin + "/report " + (logs / "*").string() + " --no-checkpoints -o " +
                          (logs / "report.html").string());
  EXPECT_EQ(rep.code, 0) << rep.out << rep.err;
  const nlohmann::json page = st::test::page_data(slurp(logs / "report.html"));
  ASSERT_TRUE(page.is_object()) << "report.html has no data document";
  EXPECT_EQ(page["runs"].size(), kRuns.size());
  const Cmd sum = run_cmd("python3 " ST_SOURCE_DIR "/apps/repro_summary.py " + logs.string());
  EXPECT_EQ(sum.code, 0) << sum.err;
  for (const auto& r : kRuns) EXPECT_NE(sum.out.find(r), std::string::npos) << sum.out;

  const Cmd bad = study(study_file("jobs_bad.yaml", kBody + "jobs: 0\n").string() + " --dry-run");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("jobs"), std::string::npos) << bad.err;

  const fs::path fout = tmp_root() / "jobs_failing";
  const fs::path file = study_file("jobs_failing.yaml",
                                   "set: {train.max_steps: 3000, train.log_every: 1000, hooks.every: 0,"
                                   " train.eval_every: 0}\ncheckpoints: 1\njobs: 2\nruns:\n  - name: long\n"
                                   "  - name: bad\n    set: {data.train_path: /nonexistent/text.txt}\n"
                                   "  - name: never\n");
  const Cmd f = study(file.string() + " --out " + fout.string());
  EXPECT_EQ(f.code, 1);
  EXPECT_NE(f.err.find("study: error: run 2/3 bad failed (train exit status 1)"), std::string::npos) << f.err;
  EXPECT_FALSE(fs::exists(fout / "never"));
  // Run long got the study's SIGTERM: stopped with its checkpoint, or (a slow start, as under
  // the sanitizers) before its first step, with none; never at its final step 3000.
  const auto ck = checkpoint_lines(fout / "long");
  EXPECT_LE(ck.size(), 1u);
  EXPECT_EQ(ck.count(3000), 0u) << "run long was not stopped";
}

TEST(Study, InterruptStopsTheRunWithACheckpointAndTheSameCommandResumes) {
  const fs::path out = tmp_root() / "interrupted";
  const fs::path file = study_file("long.yaml",
                                   "set: {train.max_steps: 1500, train.log_every: 1000, hooks.every: 0,"
                                   " train.eval_every: 0}\ncheckpoints: 1\nruns: [{name: a}, {name: b}]\n");
  const fs::path log = tmp_root() / "interrupted.log";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(ST_STUDY_BIN, ST_STUDY_BIN, file.c_str(), "--out", out.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Once run a is training (its first metrics line), SIGINT to the study alone, as a
  // terminal's Ctrl-C reaches it: the study forwards it to train.
  std::error_code ec;
  for (int i = 0; i < 300 && !(fs::exists(out / "a" / "metrics.jsonl", ec) &&
                               fs::file_size(out / "a" / "metrics.jsonl", ec) > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  const std::string console = slurp(log);
  if (WEXITSTATUS(status) == 0) GTEST_SKIP() << "run a finished before the signal came: " << console;
  EXPECT_EQ(WEXITSTATUS(status), 130) << console;
  EXPECT_NE(console.find("study: run 1/2 a stopped by a signal (train exit status 130); run the same study"
                         " command again to resume it"),
            std::string::npos)
      << console;
  EXPECT_FALSE(fs::exists(out / "b"));
  const auto ck = checkpoint_lines(out / "a");
  ASSERT_EQ(ck.size(), 1u);  // the stop's checkpoint
  const int stopped_at = ck.begin()->first;
  EXPECT_LT(stopped_at, 1500);

  const Cmd c = study(file.string() + " --out " + out.string());
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  char ckpt[32];
  std::snprintf(ckpt, sizeof ckpt, "ckpt_%08d.bin", stopped_at);
  EXPECT_NE(c.out.find(std::string("study: run 1/2 a: resuming from ") + ckpt + "\n"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("(1 trained, 1 resumed, 0 skipped)"), std::string::npos) << c.out;
  EXPECT_TRUE(checkpoint_lines(out / "a").count(1500));
  EXPECT_TRUE(checkpoint_lines(out / "b").count(1500));
}

// Runs of different model shapes: compare compares their losses only (exit 0) and the study
// finishes. A compare that fails (here a stand-in that exits 1): the report is still written
// and the study ends with status 1 naming compare.
TEST(Study, AFailedCompareStillWritesTheReport) {
  const fs::path out = tmp_root() / "shapes";
  const fs::path file = study_file("shapes.yaml", "checkpoints: 2\naxes:\n  model.n_embd: [16, 32]\n");
  const Cmd ok = study(file.string() + " --out " + out.string());
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("study: run 2/2 n_embd-32\n"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("different model shapes"), std::string::npos) << ok.out;  // compare's own line
  EXPECT_NE(ok.out.find("study: done"), std::string::npos) << ok.out;

  const fs::path fake = tmp_root() / "failing_compare.sh";
  std::ofstream(fake) << "#!/bin/sh\necho 'compare: error: a stand-in that fails' >&2\nexit 1\n";
  fs::permissions(fake, fs::perms::owner_all);
  fs::remove(out / "report.html");
  const Cmd c = study(file.string() + " --out " + out.string() + " --compare-bin " + fake.string());
  EXPECT_EQ(c.code, 1);
  EXPECT_NE(c.out.find("study: run 2/2 n_embd-32: finished"), std::string::npos) << c.out;
  EXPECT_NE(c.err.find("compare: error: a stand-in that fails"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("study: error: compare failed (exit status 1"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("written: " + out.string() + "/report.html;"), std::string::npos) << c.err;
  EXPECT_TRUE(fs::exists(out / "report.html"));
  EXPECT_EQ(c.out.find("study: done"), std::string::npos) << c.out;
}

// A cross-key rule is judged on each run's whole set: train.seq_len 32 beside
// model.max_seq_len 32 passes although the base's max_seq_len is 16; train.seq_len 32 alone
// is reported at its line, naming the run.
TEST(Study, KeysThatBelongTogetherAreJudgedTogether) {
  const fs::path out = tmp_root() / "together";
  const Cmd ok = study(study_file("together.yaml", "set: {model.max_seq_len: 32, train.seq_len: 32}\n"
                                                   "axes:\n  run.seed: [1, 2]\n").string() +
                       " --dry-run --out " + out.string());
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("train.seq_len=32"), std::string::npos) << ok.out;
  const Cmd bad = study(study_file("apart.yaml", "set: {train.seq_len: 32}\naxes:\n  run.seed: [1, 2]\n").string() +
                        " --dry-run --out " + out.string());
  EXPECT_EQ(bad.code, 1);
  EXPECT_EQ(count(bad.err, "\n"), 1) << bad.err;
  EXPECT_NE(bad.err.find("apart.yaml:2: set.train.seq_len: train.seq_len = 32 exceeds model.max_seq_len = 16"),
            std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("(run 'seed-1')"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(out));
}

// The shipped study files pass every check (a dry run from the repository root, where their
// paths point): a config key renamed later would fail here, not after hours of runs.
TEST(Study, ShippedStudyFilesPassTheirChecks) {
  const fs::path out = tmp_root() / "shipped";
  const Cmd c = run_cmd("cd " ST_SOURCE_DIR " && " ST_STUDY_BIN " configs/studies/tiny_backends.yaml --dry-run --out " +
                        out.string());
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("8 runs (axes attention.backend x run.seed and 2 from runs:)"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("train.ckpt_every 50 on every run; reference backend-baseline_seed-1"), std::string::npos)
      << c.out;
  EXPECT_EQ(count(c.out, ": to train\n"), 8) << c.out;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
