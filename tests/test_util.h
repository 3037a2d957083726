// Small helpers shared by the test programs.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <list>
#include <string>

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

// Runs a shell command; its exit status, or -1 if it did not exit normally.
inline int sh(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
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

#ifdef ST_SHARED_DATA_DIR
inline const std::string kVocabDir = ST_SHARED_DATA_DIR "/gpt2-tokenizer";
#endif

}  // namespace st::test
