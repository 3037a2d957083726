// Small helpers shared by the test programs.
#pragma once
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/rng.h"

namespace st::test {

// A whole file's bytes ("" if it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A fresh directory under the system temp dir, unique to this process (emptied if left
// over from an earlier process with the same pid), removed when the test program exits
// (set ST_KEEP_TEST_DIRS=1 to keep it for a look).
inline std::filesystem::path make_scratch_dir(const std::string& prefix) {
  struct RemoveAtExit {
    std::filesystem::path dir;
    ~RemoveAtExit() {
      std::error_code ec;
      if (!std::getenv("ST_KEEP_TEST_DIRS")) std::filesystem::remove_all(dir, ec);
    }
  };
  static std::list<RemoveAtExit> made;  // destroyed at exit, after every test has run
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / (prefix + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  made.emplace_back();  // no temporary: its destructor would remove the directory now
  made.back().dir = d;
  return d;
}

// The scratch folder of this test program for `prefix`: make_scratch_dir(prefix) on the
// first call, the same folder on every later call (from any source file of the program).
inline const std::filesystem::path& scratch_root(const std::string& prefix) {
  static std::mutex m;
  static std::map<std::string, std::filesystem::path> made;
  const std::lock_guard<std::mutex> lock(m);
  auto it = made.find(prefix);
  if (it == made.end()) it = made.emplace(prefix, make_scratch_dir(prefix)).first;
  return it->second;
}

// The message of the st::Error that f throws; a test failure (and "(no error)") if none.
template <class Error>
std::string error_message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "(no error)";
}

// The message of the st::Error that f throws (error_message_of).
inline std::string error_of(const std::function<void()>& f) { return error_message_of<Error>(f); }

// Runs a shell command; its exit status, or -1 if it did not exit normally.
inline int sh(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// What a command line did: its exit status (-1 if it did not exit normally), its stdout and
// its stderr.
struct Cmd {
  int code;
  std::string out, err;
};

// Runs `cmd` through the shell, its stdout and stderr caught in `dir`/cmd.out and
// `dir`/cmd.err (the last command's stay there for a look).
inline Cmd run_cmd(const std::string& cmd, const std::filesystem::path& dir) {
  const std::filesystem::path o = dir / "cmd.out", e = dir / "cmd.err";
  const int code = sh(cmd + " >" + o.string() + " 2>" + e.string());
  return {code, slurp(o), slurp(e)};
}

// A deterministic pseudo-text of ~40 KB (words from a small vocabulary) at `p`, written
// once; returns the path.
inline std::string pseudo_text_file(const std::filesystem::path& p) {
  if (!std::filesystem::exists(p)) {
    const char* words[] = {"the ", "king ", "shall ", "not ", "die ", "to ", "night ", "and ",
                           "my ", "lord ", "of ", "york\n", "good ", "morrow ", "sweet ", "friend,\n"};
    Rng r(99);
    std::ofstream f(p);
    for (int i = 0; i < 8000; ++i) f << words[r.below(16)];
  }
  return p.string();
}

// Runs f (which reads the FIFO `fifo`) on a thread and returns its exception text ("" when
// it returned). A call still blocked after 5 s is a test failure; a writer opened on the
// FIFO then ends the blocked open so the thread can finish.
inline std::string error_without_blocking_on_fifo(const std::string& fifo,
                                                  const std::function<void()>& f) {
  auto msg = std::make_shared<std::string>();
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> fut = done->get_future();
  std::thread([f, msg, done] {
    try {
      f();
    } catch (const std::exception& e) {
      *msg = e.what();
    }
    done->set_value();
  }).detach();
  if (fut.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on the FIFO " << fifo << " for 5 s";
    const int fd = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) close(fd);
    fut.wait_for(std::chrono::seconds(5));
  }
  return *msg;
}

}  // namespace st::test
