// Nothing lost, whatever happens (issue 19), through the real `train` binary on a tiny model:
//  - write errors (a real EFBIG from RLIMIT_FSIZE) end the run non-zero, naming the file;
//  - SIGTERM/SIGINT: the step finishes, a checkpoint is written, exit 128+signal, and the
//    resumed run ends bit for bit where the uninterrupted one does; a second signal ends the
//    process at once;
//  - the run-directory lock refuses a second train / --resume / --overwrite with the PID;
//  - crash consistency: kill -9 at chosen points (after a checkpoint's rename, before its
//    metrics record; during resume start-up) and at random moments, then resume until done:
//    the final checkpoint is byte-identical to the uninterrupted run's and every line of
//    metrics.jsonl (timing fields aside) and of the hook CSVs equals it.
// The `slow` label repeats the random interruptions many times: kill -9 (40 runs), SIGINT /
// SIGTERM (10) and a full disk (10, RLIMIT_FSIZE of 4..1024 KiB); STABLETRAIN_CRASH_TRIALS
// sets the number of runs of each (default suite: 6 runs with kill -9).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "test_util.h"
#include "io/checkpoint.h"
#include "train/run_io.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using st::test::slurp;

namespace {

const fs::path& tmp_root() { return st::test::scratch_root("st_run_safety_"); }

std::string text_file() { return st::test::pseudo_text_file(tmp_root() / "text.txt"); }

// 2 layers, BF16, hooks every 2 steps (CSV rows to cut back on resume), checkpoints every 3.
std::string write_config(const std::string& name, int max_steps, int ckpt_every = 3,
                         const std::string& extra = "") {
  std::ostringstream y;
  y << "run: {name: " << name << ", out_dir: '" << (tmp_root() / name).string() << "', seed: 7}\n"
    << "model: {n_layer: 2, n_head: 2, n_embd: 32, max_seq_len: 16, vocab_size: 256}\n"
    << "data: {train_path: '" << text_file() << "', tokenizer: byte, val_fraction: 0.1}\n"
    << "train: {max_steps: " << max_steps << ", batch_size: 4, seq_len: 16, grad_accum_steps: 1,"
    << " lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 3, ckpt_every: " << ckpt_every
    << ", keep_checkpoints: 2, eval_every: 4, eval_batches: 2, log_every: 100, sample_tokens: 0}\n"
    << "precision: {compute: bf16}\n"
    << "hooks: {every: 2}\n"
    << "device: cpu\n"
    << extra;
  const fs::path p = tmp_root() / (name + ".yaml");
  std::ofstream(p) << y.str();
  return p.string();
}

fs::path run_dir(const std::string& name) { return tmp_root() / name; }

struct Proc {
  pid_t pid = -1;
  fs::path err;
};

// Starts `train --config cfg args...` with extra environment entries; stdout and stderr go
// to a file. `shell_prefix` (e.g. "ulimit -f 8;") runs before exec in bash.
Proc start(const std::string& cfg, const std::vector<std::string>& args,
           const std::vector<std::string>& env = {}, const std::string& shell_prefix = "") {
  static int n = 0;
  Proc p;
  p.err = tmp_root() / ("out_" + std::to_string(n++) + ".txt");
  std::string cmd = shell_prefix + " exec " + std::string(ST_TRAIN_BIN) + " --config '" + cfg + "'";
  for (const auto& a : args) cmd += " " + a;
  cmd += " >'" + p.err.string() + "' 2>&1";
  p.pid = ::fork();
  if (p.pid == 0) {
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    ::execl("/bin/bash", "bash", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return p;
}

// Exit code, or 128 + signal; kills and fails after `timeout_s`.
int wait_for(const Proc& p, double timeout_s = 120) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(p.pid, &st, WNOHANG);
    if (r == p.pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &st, 0);
      ADD_FAILURE() << "train did not end within " << timeout_s << " s: " << slurp(p.err);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int run(const std::string& cfg, const std::vector<std::string>& args, std::string* out = nullptr,
        const std::vector<std::string>& env = {}, const std::string& shell_prefix = "") {
  const Proc p = start(cfg, args, env, shell_prefix);
  const int rc = wait_for(p);
  if (out) *out = slurp(p.err);
  return rc;
}

// Waits until `pred` holds (polling); false after `timeout_s`.
bool wait_until(const std::function<bool()>& pred, double timeout_s = 60) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!pred()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

int count_lines(const fs::path& p, const std::string& needle) {
  std::ifstream f(p);
  int n = 0;
  for (std::string l; std::getline(f, l);) n += l.find(needle) != std::string::npos;
  return n;
}

// metrics.jsonl without the wall-clock fields, one string per line.
std::vector<std::string> metrics_lines(const fs::path& dir) {
  std::vector<std::string> out;
  std::ifstream f(dir / "metrics.jsonl");
  for (std::string l; std::getline(f, l);) {
    auto j = nlohmann::ordered_json::parse(l, nullptr, false);
    if (j.is_discarded()) {
      out.push_back("UNPARSABLE: " + l);
      continue;
    }
    j.erase("elapsed");
    j.erase("tokens_per_s");
    out.push_back(j.dump());
  }
  return out;
}

const char* const kRunFiles[] = {"spectral.csv", "grad_norms.csv", "attn_stats.csv",
                                 "delta_drift.csv", "events.jsonl"};

// The training state of two checkpoints is the same: every field but the config text (it
// names the run directory) and the wall time.
void expect_same_state(const fs::path& a, const fs::path& b) {
  ASSERT_TRUE(fs::exists(a)) << a;
  ASSERT_TRUE(fs::exists(b)) << b;
  const st::CheckpointState x = st::load_checkpoint(a.string()), y = st::load_checkpoint(b.string());
  EXPECT_EQ(x.step, y.step);
  EXPECT_EQ(x.adam_step, y.adam_step);
  EXPECT_TRUE(x.master == y.master) << b << ": master weights differ from " << a;
  EXPECT_TRUE(x.m == y.m) << b << ": Adam m differs";
  EXPECT_TRUE(x.v == y.v) << b << ": Adam v differs";
  EXPECT_EQ(x.loss_scale, y.loss_scale);
  EXPECT_EQ(x.loss_scale_good_steps, y.loss_scale_good_steps);
  EXPECT_TRUE(x.rng_state == y.rng_state) << b << ": RNG state differs";
  EXPECT_TRUE(x.data_state == y.data_state) << b << ": data position differs";
  EXPECT_TRUE(x.hooks_state == y.hooks_state) << b << ": hooks state differs";
}

// Everything but timing equals the reference run's: the final training state, metrics.jsonl
// line by line (timing fields aside), the hook files byte for byte.
void expect_same_run(const fs::path& ref, const fs::path& got, const std::string& final_ckpt) {
  expect_same_state(ref / final_ckpt, got / final_ckpt);
  EXPECT_EQ(metrics_lines(ref), metrics_lines(got)) << got;
  for (const char* f : kRunFiles) {
    if (fs::exists(ref / f) || fs::exists(got / f)) {
      EXPECT_TRUE(slurp(ref / f) == slurp(got / f)) << got << ": " << f << " differs from " << ref;
    }
  }
}

// The uninterrupted reference of a config (made once per name).
fs::path reference(const std::string& name, int max_steps) {
  const std::string cfg = write_config(name, max_steps);
  if (!fs::exists(run_dir(name) / "ckpt_00000024.bin")) {
    std::string out;
    EXPECT_EQ(run(cfg, {}, &out), 0) << out;
  }
  return run_dir(name);
}

}  // namespace

// ---- 1. write errors ----

// A real write error: RLIMIT_FSIZE makes write(2) fail with EFBIG past the limit (SIGXFSZ
// ignored, as `trap '' XFSZ` does). LogFile reports it with the file name and errno.
TEST(RunSafety, LogFileReportsAFailedWrite) {
  const fs::path path = tmp_root() / "limited.log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit rl{100, 100};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    try {
      st::LogFile f(path.string(), "step,value");
      for (int i = 0; i < 20; ++i) f << i << ",0.123456789\n";
      f.flush();
      ::_exit(2);  // no error: the defect
    } catch (const st::Error& e) {
      const std::string m = e.what();
      ::_exit(m.find(path.string()) != std::string::npos &&
                      m.find("File too large") != std::string::npos
                  ? 0
                  : 3);
    }
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "2: the write error went unnoticed; 3: message lacks file or errno";
}

// The probe's case: the disk fills between checkpoints. Before the fix train exited 0 with
// metrics.jsonl cut; now the first failed write of a log ends the run non-zero, naming it.
TEST(RunSafety, TrainStopsOnAFullDisk) {
  // No checkpoint before the end (ckpt_every 0): only the logs grow until the limit.
  const std::string cfg = write_config("enospc", 200, 0, "");
  std::string out;
  const int rc = run(cfg, {}, &out, {}, "trap '' XFSZ; ulimit -f 24;");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  EXPECT_TRUE(out.find("metrics.jsonl") != std::string::npos ||
              out.find("train.log") != std::string::npos || out.find(".csv") != std::string::npos)
      << out;
  EXPECT_NE(out.find("train: error: "), std::string::npos) << out;
  // No checkpoint yet: the advice is to start again, not --resume (which would refuse).
  EXPECT_NE(out.find("no checkpoint was written yet: free space, then start again with "
                     "--overwrite"), std::string::npos) << out;
  EXPECT_TRUE(st::list_checkpoints(run_dir("enospc").string()).empty());
}

// ---- 2. signals ----

TEST(RunSafety, SigtermWritesACheckpointAndResumesExactly) {
  const fs::path ref = reference("sig_ref", 24);
  const std::string cfg = write_config("sig", 24);
  const Proc p = start(cfg, {});
  // Some steps in, not at a checkpoint step: the stop must write its own checkpoint.
  ASSERT_TRUE(wait_until([&] { return count_lines(run_dir("sig") / "metrics.jsonl", "\"loss\"") >= 4; }));
  ::kill(p.pid, SIGTERM);
  const int rc = wait_for(p);
  const std::string out = slurp(p.err);
  ASSERT_EQ(rc, 128 + SIGTERM) << out;
  EXPECT_NE(out.find("stopped by SIGTERM after step"), std::string::npos) << out;
  EXPECT_NE(out.find("--resume"), std::string::npos) << out;
  // The checkpoint of the step it stopped after is there.
  const auto m = metrics_lines(run_dir("sig"));
  int64_t last = 0;
  for (const auto& l : m) {
    const auto j = nlohmann::json::parse(l);
    if (j.contains("loss")) last = j["step"];
  }
  char name[32];
  std::snprintf(name, sizeof name, "ckpt_%08lld.bin", static_cast<long long>(last));
  EXPECT_TRUE(fs::exists(run_dir("sig") / name)) << name;
  std::string out2;
  ASSERT_EQ(run(cfg, {"--resume"}, &out2), 0) << out2;
  // Same weights as the uninterrupted run. (metrics.jsonl differs only by the extra
  // checkpoint record of the stop step, when it was not a checkpoint step.)
  expect_same_state(ref / "ckpt_00000024.bin", run_dir("sig") / "ckpt_00000024.bin");
  std::vector<std::string> got;
  for (const auto& l : metrics_lines(run_dir("sig")))
    if (l.find("\"checkpoint\"") == std::string::npos || last % 3 == 0 ||
        l.find(name) == std::string::npos)
      got.push_back(l);
  EXPECT_EQ(metrics_lines(ref), got);
}

// A second signal ends the process at once: here the run hangs in a step (fault injection),
// so without it the process would never end.
TEST(RunSafety, SecondSignalEndsAtOnce) {
  const std::string cfg = write_config("sig2", 24);
  const Proc p = start(cfg, {}, {"STABLETRAIN_FAULT=0:5:step:hang"});
  ASSERT_TRUE(wait_until([&] { return slurp(p.err).find("injected fault") != std::string::npos; }));
  ::kill(p.pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(p.pid, SIGINT);
  const int rc = wait_for(p, 20);
  EXPECT_EQ(rc, 128 + SIGINT) << slurp(p.err);
  EXPECT_NE(slurp(p.err).find("second stop signal"), std::string::npos) << slurp(p.err);
}

// ---- 3. run-directory lock ----

TEST(RunSafety, SecondProcessIsRefusedWhileARunHoldsTheDirectory) {
  const std::string cfg = write_config("lock", 24);
  const Proc p = start(cfg, {}, {"STABLETRAIN_FAULT=0:5:step:hang"});
  ASSERT_TRUE(wait_until([&] { return slurp(p.err).find("injected fault") != std::string::npos; }));
  const std::string before = slurp(run_dir("lock") / "ckpt_00000003.bin");
  ASSERT_FALSE(before.empty());
  const std::string holder = "in use by another train process (PID " + std::to_string(p.pid) + ")";
  for (const char* arg : {"--resume", "--overwrite"}) {
    std::string out;
    EXPECT_NE(run(cfg, {arg}, &out), 0) << out;
    EXPECT_NE(out.find(holder), std::string::npos) << arg << ": " << out;
  }
  std::string out;
  EXPECT_NE(run(cfg, {}, &out), 0) << out;  // refused as a non-empty directory already
  EXPECT_EQ(slurp(run_dir("lock") / "ckpt_00000003.bin"), before);  // --overwrite deleted nothing
  ::kill(p.pid, SIGKILL);  // the OS releases the lock of a dead process
  wait_for(p);
  EXPECT_EQ(run(cfg, {"--resume"}, &out), 0) << out;
}

// Two runs started together into one new directory: exactly one trains (the probe saw both
// accepted in 4 of 30 tries).
TEST(RunSafety, TwoRunsStartedTogetherOneIsRefused) {
  const std::string cfg = write_config("race", 6);
  for (int t = 0; t < 4; ++t) {
    fs::remove_all(run_dir("race"));
    const Proc a = start(cfg, {}), b = start(cfg, {});
    const int ra = wait_for(a), rb = wait_for(b);
    EXPECT_TRUE((ra == 0) != (rb == 0)) << "try " << t << ": exit codes " << ra << " and " << rb
                                        << "\n" << slurp(a.err) << "\n" << slurp(b.err);
    const std::string loser = slurp(ra == 0 ? b.err : a.err);
    const int winner = ra == 0 ? a.pid : b.pid;
    EXPECT_TRUE(loser.find("in use by another train process (PID " + std::to_string(winner) +
                           ")") != std::string::npos ||
                loser.find("already exists and is not empty") != std::string::npos)
        << loser;
    EXPECT_EQ(count_lines(run_dir("race") / "metrics.jsonl", "\"loss\""), 6);
  }
}

// Two --resume started together (the probe saw both run: 34 loss lines for 25 steps).
// Both carry a hang at step 20, so whichever takes the lock holds it until killed: the
// other must be refused whatever the scheduling (without the hang, a loaded machine let the
// first finish all 37 steps before the second started, and the second then rightly said
// "nothing to do"). Had both taken the lock, both would hang and neither would end.
TEST(RunSafety, TwoResumesStartedTogetherOneIsRefused) {
  const std::string cfg = write_config("race2", 40);
  const std::vector<std::string> hang = {"STABLETRAIN_FAULT=0:20:step:hang"};
  for (int t = 0; t < 3; ++t) {
    fs::remove_all(run_dir("race2"));
    std::string out;
    ASSERT_EQ(run(cfg, {"--stop-after", "3"}, &out), 0) << out;
    const Proc a = start(cfg, {"--resume"}, hang), b = start(cfg, {"--resume"}, hang);
    // The first of the two to end is the refused one.
    const Proc* refused = nullptr;
    int rc = 0;
    const bool one_ended = wait_until(
        [&] {
          for (const Proc* p : {&a, &b}) {
            int st = 0;
            if (::waitpid(p->pid, &st, WNOHANG) == p->pid) {
              refused = p;
              rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
              return true;
            }
          }
          return false;
        },
        120);
    if (!one_ended) {
      for (const Proc* p : {&a, &b}) ::kill(p->pid, SIGKILL), ::waitpid(p->pid, nullptr, 0);
      FAIL() << "try " << t << ": neither resume ended: both took the run directory\n"
             << slurp(a.err) << "\n" << slurp(b.err);
    }
    const Proc& holder = refused == &a ? b : a;
    EXPECT_NE(rc, 0) << "try " << t;
    // With the holder's PID, though it may not have written it to the lock file yet (the
    // probe saw it missing).
    EXPECT_NE(slurp(refused->err).find("in use by another train process (PID " +
                                       std::to_string(holder.pid) + ")"),
              std::string::npos)
        << slurp(refused->err);
    EXPECT_TRUE(wait_until(
        [&] { return slurp(holder.err).find("injected fault") != std::string::npos; }))
        << slurp(holder.err);
    ::kill(holder.pid, SIGKILL);
    EXPECT_EQ(wait_for(holder), 128 + SIGKILL);
    ASSERT_EQ(run(cfg, {"--resume"}, &out), 0) << out;
    EXPECT_EQ(count_lines(run_dir("race2") / "metrics.jsonl", "\"loss\""), 40);
  }
}

// ---- 4 and 10. kills at chosen points, and at random moments ----

// kill -9 right after a checkpoint's rename, before its metrics record (the record was lost
// before the fix), and during resume start-up after the logs were cut back (they were
// rewritten in place, so a kill there emptied them).
TEST(RunSafety, KillAfterCheckpointRenameAndDuringResume) {
  const fs::path ref = reference("kill_ref", 24);
  const std::string cfg = write_config("kill", 24);
  std::string out;
  EXPECT_EQ(run(cfg, {}, &out, {"STABLETRAIN_FAULT=0:9:ckpt_written:kill"}), 128 + SIGKILL) << out;
  ASSERT_TRUE(fs::exists(run_dir("kill") / "ckpt_00000009.bin"));
  EXPECT_EQ(count_lines(run_dir("kill") / "metrics.jsonl", "ckpt_00000009.bin"), 0);
  // Resume, killed after cutting the logs back to step 9, before re-deriving the record.
  EXPECT_EQ(run(cfg, {"--resume"}, &out, {"STABLETRAIN_FAULT=0:9:resume:kill"}), 128 + SIGKILL)
      << out;
  EXPECT_GT(count_lines(run_dir("kill") / "metrics.jsonl", "\"loss\""), 8);
  EXPECT_EQ(run(cfg, {"--resume"}, &out), 0) << out;
  expect_same_run(ref, run_dir("kill"), "ckpt_00000024.bin");
}

namespace {

// How an attempt is interrupted.
enum class Hit { kKill, kSignal, kDiskFull };

struct TrialStats {
  int attempts = 0, interrupted = 0, clean_errors = 0;
};

// Checkpoint records of steps the schedule (every 3 steps, and 24) does not checkpoint: a stop
// signal adds one for the step it stopped after.
bool off_schedule_record(const std::string& line) {
  if (line.find("\"checkpoint\"") == std::string::npos) return false;
  const auto j = nlohmann::json::parse(line);
  const int64_t s = j["step"];
  return s % 3 != 0 && s != 24;
}

// Random interruptions of one run until it ends: kill -9 or SIGINT/SIGTERM after a uniform
// delay in [0, 1.3 x the reference run's wall time], or a file-size limit (a full disk: the
// write that crosses it fails with EFBIG) of 4..1024 KiB. After each one the run is resumed
// (started over with --overwrite when no checkpoint was written yet); the third and later
// attempts run undisturbed. The end state must equal the uninterrupted run's. Prints the
// counts of attempts, interruptions and clean errors.
void interrupted_trials(Hit hit, int trials, uint64_t seed) {
  TrialStats counts;
  const fs::path ref = reference("trial_ref", 24);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::string out;
    ASSERT_EQ(run(write_config("trial_time", 24), {"--overwrite"}, &out), 0) << out;
  }
  const double full_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st::Rng rng(seed);
  for (int t = 0; t < trials; ++t) {
    const std::string name = "trial" + std::to_string(t);
    const std::string cfg = write_config(name, 24);
    fs::remove_all(run_dir(name));
    for (int attempt = 0;; ++attempt) {
      ASSERT_LT(attempt, 50) << name << ": never finished";
      const bool started = fs::exists(run_dir(name));
      bool has_ckpt = false;
      if (started)
        for (const auto& e : fs::directory_iterator(run_dir(name))) {
          const std::string f = e.path().filename().string();
          has_ckpt |= f.rfind("ckpt_", 0) == 0 && e.path().extension() == ".bin";
        }
      const std::vector<std::string> args =
          has_ckpt ? std::vector<std::string>{"--resume"}
                   : started ? std::vector<std::string>{"--overwrite"} : std::vector<std::string>{};
      const bool disturb = attempt < 2;
      std::string prefix;
      if (hit == Hit::kDiskFull && disturb)
        prefix = "trap '' XFSZ; ulimit -f " + std::to_string(4 << rng.below(9)) + ";";
      const Proc p = start(cfg, args, {}, prefix);
      ++counts.attempts;
      const double delay =
          disturb && hit != Hit::kDiskFull ? rng.uniform() * 1.3 * full_s : 1e9;
      const int sig = hit == Hit::kKill ? SIGKILL : rng.below(2) ? SIGINT : SIGTERM;
      const auto ts = std::chrono::steady_clock::now();
      int rc = -1;
      bool sent = false;
      for (;;) {
        int st = 0;
        if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
          rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          break;
        }
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
        ASSERT_LT(waited, 300.0) << name << ": attempt " << attempt << " hangs";
        if (!sent && waited > delay) {
          ::kill(p.pid, sig);
          sent = true;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      const std::string out = slurp(p.err);
      if (rc == 0) break;
      ++counts.interrupted;
      if (hit == Hit::kKill) {
        ASSERT_EQ(rc, 128 + SIGKILL) << name << " attempt " << attempt << ": " << out;
      } else if (hit == Hit::kSignal) {
        ASSERT_EQ(rc, 128 + sig) << name << " attempt " << attempt << ": " << out;
        // Stopped by the handler (one line saying how to resume), or by the default action
        // before the handlers were installed (no output then).
        if (out.find("stopped by") != std::string::npos) ++counts.clean_errors;
      } else {
        ASSERT_EQ(rc, 1) << name << " attempt " << attempt << ": " << out;
        ASSERT_NE(out.find("File too large"), std::string::npos) << out;
        // The advice fits what is on disk: --resume names the newest checkpoint; with none,
        // start again.
        const auto ckpts = st::list_checkpoints(run_dir(name).string());
        if (ckpts.empty())
          EXPECT_NE(out.find("start again with --overwrite"), std::string::npos) << out;
        else
          EXPECT_NE(out.find("then --resume: it continues from " + ckpts.back().second),
                    std::string::npos) << out;
        ++counts.clean_errors;
      }
    }
    std::vector<std::string> got;
    for (const auto& l : metrics_lines(run_dir(name)))
      if (hit != Hit::kSignal || !off_schedule_record(l)) got.push_back(l);
    expect_same_state(ref / "ckpt_00000024.bin", run_dir(name) / "ckpt_00000024.bin");
    EXPECT_EQ(metrics_lines(ref), got) << name;
    for (const char* f : kRunFiles) {
      if (fs::exists(ref / f) || fs::exists(run_dir(name) / f)) {
        EXPECT_TRUE(slurp(ref / f) == slurp(run_dir(name) / f)) << name << ": " << f;
      }
    }
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "trial " << t << " (seed " << seed << ") differs from the reference";
      return;
    }
    fs::remove_all(run_dir(name));
  }
  std::printf("probe: %s: %d runs, %d attempts, %d interrupted, %d with a clean message, end "
              "state identical in all (reference run %.2f s)\n",
              hit == Hit::kKill ? "kill -9" : hit == Hit::kSignal ? "SIGINT/SIGTERM" : "disk full",
              trials, counts.attempts, counts.interrupted, counts.clean_errors, full_s);
}

int trials_from_env(int dflt) {
  const char* v = std::getenv("STABLETRAIN_CRASH_TRIALS");
  return v && *v ? std::atoi(v) : dflt;
}

}  // namespace

TEST(RunSafety, CrashConsistency) {
  interrupted_trials(Hit::kKill, trials_from_env(6), 1);
}
TEST(RunSafetySlow, CrashConsistencyMany) {
  interrupted_trials(Hit::kKill, trials_from_env(40), 2);
}
TEST(RunSafetySlow, StopSignalsAtRandomMoments) {
  interrupted_trials(Hit::kSignal, trials_from_env(10), 3);
}
TEST(RunSafetySlow, DiskFullThenResume) {
  interrupted_trials(Hit::kDiskFull, trials_from_env(10), 4);
}
