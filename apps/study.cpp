// study: one command for a side-by-side experiment (issue 23, docs/studies.md).
//
//   study STUDY.yaml [--out DIR] [--jobs N] [--dry-run] [--train-bin P] [--compare-bin P]
//         [--report-bin P]
//
// The study file names a base config, overrides for every run (set:), the axes to vary (their
// cross product, in file order) and explicit extra runs (runs:). Every run is checked by the
// config loader before the first one starts; then the runs train one after another (or
// `jobs` at a time: the file's jobs:, or --jobs), each by the `train` binary in OUT/NAME,
// with the same train.ckpt_every so that their checkpoints
// are aligned; then `compare` (the reference against every other run) and `report`.
//
// Resumable: each run's directory is looked at first. Finished (metrics.jsonl holds the
// checkpoint line of step train.max_steps): skipped. Started (a checkpoint): continued with
// `train --config OUT/NAME/config.yaml --resume`. Started without a checkpoint yet: started
// over (`--overwrite`). A directory whose config.yaml differs from what the study gives now,
// or that holds files but no config.yaml, is refused before any run starts.
//
// The console of every train process passes through, after a line `study: run I/N NAME`
// (interleaved when several run at once; each run's train.log holds its own).
// A failing run stops the study (exit 1) naming the run and its train.log; a run stopped by
// Ctrl-C or SIGTERM (the study forwards them to train, which checkpoints and stops) stops
// the study with train's status (130/143): the same command resumes. Errors: one line on
// stderr, exit status 1 (2 for usage errors).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "apps/study/study_file.h"
#include "train/config.h"

using namespace st;
using namespace st::study_tool;
namespace fs = std::filesystem;

namespace {

// The running children's pids, for forwarding (0: a free slot). Written only with the
// signals blocked (Children below), read by the handler.
constexpr int kMaxJobs = 64;
volatile sig_atomic_t g_children[kMaxJobs] = {};

void forward_signal(int sig) {
  for (int i = 0; i < kMaxJobs; ++i)
    if (g_children[i] > 0) kill(g_children[i], sig);
}

// Starts `argv` as a child process with the console inherited and returns its pid. SIGINT
// and SIGTERM sent to the study go to every running child once (each is in its own process
// group, so a terminal's Ctrl-C reaches it only through us), and a child gets SIGTERM if the
// study dies.
pid_t start_child(const std::vector<std::string>& argv) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  const pid_t parent = getpid();
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigprocmask(SIG_BLOCK, &block, &old);  // a signal now waits until the pid is recorded
  const pid_t pid = fork();
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &old, nullptr);
    fail("cannot start ", argv[0], ": fork: ", std::strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(143);  // the study died before prctl
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    execv(a[0], a.data());
    std::fprintf(stderr, "study: error: cannot run %s: %s\n", a[0], std::strerror(errno));
    _exit(127);
  }
  for (int i = 0; i < kMaxJobs; ++i)
    if (g_children[i] == 0) {
      g_children[i] = pid;
      break;
    }
  sigprocmask(SIG_SETMASK, &old, nullptr);
  return pid;
}

// Waits for one child (pid, or any when -1); returns its pid and sets `code` to its exit
// status (128 + signal when a signal ended it).
pid_t wait_child(pid_t pid, int& code) {
  int status = 0;
  pid_t got;
  while ((got = waitpid(pid, &status, 0)) < 0) {
    if (errno != EINTR) fail("waiting for a child process: ", std::strerror(errno));
  }
  for (int i = 0; i < kMaxJobs; ++i)
    if (g_children[i] == got) g_children[i] = 0;
  code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return got;
}

int run_child(const std::vector<std::string>& argv) {
  int code = 0;
  wait_child(start_child(argv), code);
  return code;
}

// The folder of this executable (/proc/self/exe), where train, compare and report are built.
std::string own_dir() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

std::string find_bin(const std::string& given, const std::string& name, const char* option) {
  const std::string p = given.empty() ? own_dir() + "/" + name : given;
  if (!fs::is_regular_file(p) || access(p.c_str(), X_OK) != 0)
    fail(name, " binary '", p, "' is not an executable file (build it, or give ", option, " PATH)");
  return p;
}

// What is in a run's directory.
struct RunState {
  enum Kind { kNew, kFinished, kResume, kRestart } kind = kNew;
  std::string checkpoint;  // kResume: the newest checkpoint's file name
};

// Whether metrics.jsonl holds the checkpoint line of step `final_step` (a cut-off line is skipped).
bool has_final_checkpoint_line(const fs::path& metrics, int64_t final_step) {
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    if (line.find("\"checkpoint\"") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);  // a cut-off last line: skipped
    if (j.is_object() && j.contains("checkpoint") && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() == final_step)
      return true;
  }
  return false;
}

std::string newest_checkpoint(const fs::path& dir) {
  static const std::regex re("ckpt_([0-9]{8})\\.bin");
  std::string best;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, re) && n > best) best = n;
  }
  return best;
}

RunState inspect(const Study& s, const StudyRun& r) {
  RunState st;
  const fs::path dir(r.dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return st;
  if (!fs::is_directory(dir, ec)) fail(r.dir, " (run '", r.name, "') exists and is not a directory");
  bool files = false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() != "train.lock") files = true;
  if (!files) return st;
  const fs::path cfg = dir / "config.yaml";
  if (!fs::is_regular_file(cfg, ec))
    fail(r.dir, " (run '", r.name, "') holds files but no config.yaml: not a run of this study;",
         " move it away or give another out_dir");
  // The run's config, read by the loader, against the study's: any difference is refused.
  Config have;
  try {
    have = load_config(cfg.string());
  } catch (const Error& e) {
    fail(r.dir, " (run '", r.name, "'): its config.yaml cannot be read: ", e.what());
  }
  const std::string have_yaml = config_to_yaml(have);
  if (have_yaml != r.config_yaml) {
    const auto a = flatten_config(have_yaml), b = flatten_config(r.config_yaml);
    std::string key = "?", va, vb;
    for (const auto& [k, v] : b)
      if (!a.count(k) || a.at(k) != v) {
        key = k, vb = v, va = a.count(k) ? a.at(k) : "(absent)";
        break;
      }
    fail(cfg.string(), ": run '", r.name, "' was trained with ", key, " = '", va, "' but ", s.file,
         " now gives '", vb, "'; refusing to mix runs (move ", r.dir, " away, or give another out_dir)");
  }
  if (has_final_checkpoint_line(dir / "metrics.jsonl", have.train.max_steps)) {
    st.kind = RunState::kFinished;
    return st;
  }
  st.checkpoint = newest_checkpoint(dir);
  st.kind = st.checkpoint.empty() ? RunState::kRestart : RunState::kResume;
  return st;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot write ", path, ": ", std::strerror(errno));
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      fail("cannot write ", path, ": write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail("cannot write ", path, ": rename: ", std::strerror(e));
  }
}

std::string shell_words(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    const bool plain = !a.empty() && a.find_first_not_of(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+-=/:,@%") == std::string::npos;
    std::string w = a;
    if (!plain) {
      w = "'";
      for (char ch : a) w += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      w += "'";
    }
    s += (s.empty() ? "" : " ") + w;
  }
  return s;
}

std::string num(double v) {
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"study: train the runs of a study file one after another (resumable), with aligned"
               " checkpoints, then compare and report them (docs/studies.md)"};
  std::string study_path, out, train_bin, compare_bin, report_bin;
  bool dry_run = false;
  app.add_option("study", study_path, "the study file (YAML; docs/studies.md)")->required();
  app.add_option("--out", out, "output folder (replaces the file's out_dir)");
  app.add_flag("--dry-run", dry_run, "check the study and print each run's state and command; run nothing, write nothing");
  app.add_option("--train-bin", train_bin, "the train binary (default: train beside study)");
  app.add_option("--compare-bin", compare_bin, "the compare binary (default: compare beside study)");
  app.add_option("--report-bin", report_bin, "the report binary (default: report beside study)");
  int jobs_opt = 0;
  app.add_option("--jobs", jobs_opt, "runs trained at once (replaces the file's jobs:; default 1)")
      ->check(CLI::Range(1, kMaxJobs));
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (char& ch : msg)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "study: usage error: %s (study STUDY.yaml [--out DIR] [--dry-run]; --help for more)\n",
                 msg.c_str());
    return 2;
  }
  try {
    const Study s = load_study(study_path, out);
    const int jobs = jobs_opt > 0 ? jobs_opt : s.jobs;
    const std::string train = find_bin(train_bin, "train", "--train-bin");
    const std::string compare = s.compare && s.runs.size() > 1 ? find_bin(compare_bin, "compare", "--compare-bin") : "";
    const std::string report = s.report ? find_bin(report_bin, "report", "--report-bin") : "";
    if (fs::exists(s.out_dir) && !fs::is_directory(s.out_dir))
      fail("out_dir '", s.out_dir, "' exists and is not a directory");

    // Every run's state before anything starts: a refused directory stops the study here.
    std::vector<RunState> states;
    for (const StudyRun& r : s.runs) states.push_back(inspect(s, r));
    const size_t n = s.runs.size();
    std::string axes;
    for (const auto& k : s.axis_keys) axes += (axes.empty() ? "" : " x ") + k;
    std::string made = axes.empty() ? "" : "axes " + axes;
    if (s.n_explicit) made += (made.empty() ? "" : " and ") + std::to_string(s.n_explicit) + " from runs:";
    std::printf("study: %s: %zu runs (%s) from %s in %s; train.ckpt_every %d on every run; reference %s%s\n",
                s.file.c_str(), n, made.c_str(), s.base.c_str(), s.out_dir.c_str(), s.ckpt_every,
                s.reference.c_str(), jobs > 1 ? ("; " + std::to_string(jobs) + " at a time").c_str() : "");

    auto command = [&](const StudyRun& r, const RunState& st) {
      std::vector<std::string> a{train};
      if (st.kind == RunState::kResume) {
        a.insert(a.end(), {"--config", r.dir + "/config.yaml", "--resume"});
        return a;
      }
      a.insert(a.end(), {"--config", s.base});
      for (const auto& x : r.args) a.insert(a.end(), {"--set", x});
      if (st.kind == RunState::kRestart) a.push_back("--overwrite");
      return a;
    };
    static const char* const kStateWord[] = {"to train", "finished", "to resume", "to start over"};
    if (dry_run) {
      for (size_t i = 0; i < n; ++i) {
        const RunState& st = states[i];
        std::printf("study: run %zu/%zu %s: %s%s\n", i + 1, n, s.runs[i].name.c_str(), kStateWord[st.kind],
                    st.kind == RunState::kResume ? (" from " + st.checkpoint).c_str() : "");
        if (st.kind != RunState::kFinished) std::printf("  %s\n", shell_words(command(s.runs[i], st)).c_str());
      }
      std::printf("study: dry run: nothing run, nothing written\n");
      return 0;
    }

    fs::create_directories(s.out_dir);
    write_file_atomic(s.out_dir + "/study.yaml", resolved_study_yaml(s));
    struct sigaction sa {};
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);

    // The runs, `jobs` at a time in file order (with reference_hooks the reference first and
    // alone: the others read its checkpoints). A run stopped by a signal, or a failing run,
    // starts no further run; a failure sends SIGTERM to the others (they checkpoint and stop).
    int trained = 0, resumed = 0, skipped = 0, stopped_code = 0;
    std::string failure;
    std::vector<std::pair<pid_t, size_t>> running;
    size_t next = 0;
    while (true) {
      while (failure.empty() && stopped_code == 0 && next < n && static_cast<int>(running.size()) < jobs &&
             !(s.reference_hooks && next > 0 && trained + resumed + skipped == 0)) {
        const size_t i = next++;
        const StudyRun& r = s.runs[i];
        const RunState& st = states[i];
        if (st.kind == RunState::kFinished) {
          std::printf("study: run %zu/%zu %s: finished (step %lld checkpoint in metrics.jsonl), skipped\n", i + 1,
                      n, r.name.c_str(), static_cast<long long>(r.max_steps));
          ++skipped;
          continue;
        }
        std::printf("study: run %zu/%zu %s%s\n", i + 1, n, r.name.c_str(),
                    st.kind == RunState::kResume    ? (": resuming from " + st.checkpoint).c_str()
                    : st.kind == RunState::kRestart ? ": started before without a checkpoint; starting over"
                                                    : "");
        running.emplace_back(start_child(command(r, st)), i);
      }
      if (running.empty()) break;
      int code = 0;
      const pid_t pid = wait_child(-1, code);
      const auto it = std::find_if(running.begin(), running.end(), [&](const auto& p) { return p.first == pid; });
      if (it == running.end()) continue;
      const size_t i = it->second;
      running.erase(it);
      const StudyRun& r = s.runs[i];
      if (code == 130 || code == 143) {
        std::fprintf(stderr, "study: run %zu/%zu %s stopped by a signal (train exit status %d); run the same"
                     " study command again to resume it\n", i + 1, n, r.name.c_str(), code);
        if (stopped_code == 0) stopped_code = code;
        continue;
      }
      std::string why;
      if (code != 0) {
        const std::string log = r.dir + "/train.log";
        why = "run " + std::to_string(i + 1) + "/" + std::to_string(n) + " " + r.name + " failed (train exit status " +
              std::to_string(code) + "); " +
              (fs::exists(log) ? "its log: " + log : "train's error is above (it stopped before writing " + log + ")");
      } else if (!has_final_checkpoint_line(fs::path(r.dir) / "metrics.jsonl", r.max_steps)) {
        why = "run " + std::to_string(i + 1) + "/" + std::to_string(n) + " " + r.name +
              ": train ended without the step " + std::to_string(r.max_steps) + " checkpoint line in " + r.dir +
              "/metrics.jsonl; its log: " + r.dir + "/train.log";
      }
      if (why.empty()) {
        (states[i].kind == RunState::kResume ? resumed : trained)++;
        continue;
      }
      if (failure.empty()) {
        failure = why;
        for (const auto& [other, j] : running) kill(other, SIGTERM);  // they checkpoint and stop
      }
    }
    if (!failure.empty()) fail(failure);
    if (stopped_code) return stopped_code;

    std::vector<std::string> dirs;
    for (const StudyRun& r : s.runs) dirs.push_back(r.dir);
    std::string outputs, failed;  // a failed compare does not keep the report from being written
    if (!compare.empty()) {
      std::vector<std::string> a{compare};
      a.insert(a.end(), dirs.begin(), dirs.end());
      a.insert(a.end(), {"-o", s.out_dir + "/compare.csv"});
      if (s.top >= 0) a.insert(a.end(), {"--top", std::to_string(s.top)});
      if (s.diverge_tol > 0) a.insert(a.end(), {"--diverge-tol", num(s.diverge_tol)});
      std::printf("study: compare %s against %zu other run%s\n", s.reference.c_str(), n - 1, n == 2 ? "" : "s");
      const int code = run_child(a);
      if (code != 0) {
        failed = "compare failed (exit status " + std::to_string(code) + ", its error is above): " + shell_words(a);
        std::fprintf(stderr, "study: %s; the report is written all the same\n", failed.c_str());
      } else {
        outputs += " " + s.out_dir + "/compare.csv, " + s.out_dir + "/compare_loss.csv;";
      }
    }
    if (!report.empty()) {
      std::vector<std::string> a{report};
      a.insert(a.end(), dirs.begin(), dirs.end());
      a.insert(a.end(), {"-o", s.out_dir + "/report.html"});
      if (s.max_checkpoints > 0) a.insert(a.end(), {"--max-checkpoints", std::to_string(s.max_checkpoints)});
      if (!s.read_checkpoints) a.push_back("--no-checkpoints");
      a.insert(a.end(), {"--reference", dirs.front()});
      std::printf("study: report of the %zu runs (reference %s)\n", n, s.reference.c_str());
      const int code = run_child(a);
      if (code != 0)
        fail(failed.empty() ? "" : failed + "; ", "report failed (exit status ", code, ", its error is above): ",
             shell_words(a));
      outputs += " " + s.out_dir + "/report.html;";
    }
    if (!failed.empty()) fail(failed, " (the runs are done", outputs.empty() ? std::string() : "; written:" + outputs,
                               " run the same command again after a fix, or set compare: {enabled: false})");
    std::printf("study: done: %zu runs in %s (%d trained, %d resumed, %d skipped);%s resolved study %s/study.yaml\n",
                n, s.out_dir.c_str(), trained, resumed, skipped, outputs.c_str(), s.out_dir.c_str());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "study: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    for (char& ch : msg)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "study: error: %s\n", msg.c_str());
    return 1;
  }
  return 0;
}
