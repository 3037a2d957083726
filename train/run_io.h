// Writing a run directory so that nothing is lost, whatever happens (issue 19):
//  - LogFile: an append-only log (metrics.jsonl, the hook CSVs, events.jsonl, train.log) whose
//    every write is checked: a full disk or an I/O error is an st::Error naming the file and
//    errno, never a silently cut file. Lines are buffered in memory and handed to the kernel
//    by flush() in one write(2), so a kill -9 loses at most the lines not yet flushed and
//    leaves at most one partial last line (the readers drop a line without its newline).
//  - write_file_atomic / rewrite_lines_atomic: a whole file replaced by a temporary file in
//    the same directory, fsync, rename, fsync of the directory: a crash leaves the old
//    content or the new one, never an empty or half file.
//  - RunDirLock: an exclusive flock(2) on RUN/train.lock, held for the life of the process
//    (the OS releases it when the process dies, however it dies); a second train, --resume
//    or --overwrite into the same directory is refused with the holder's PID.
//  - Stop signals: SIGINT/SIGTERM set a flag the step loop polls (the run finishes its step,
//    writes a checkpoint and exits 128+signal); a second signal ends the process at once.
#pragma once
#include <csignal>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>

namespace st {

class LogFile {
 public:
  LogFile() = default;
  // Opens `path` for appending (creates it). A non-null `header` is written first when the
  // file is new or empty.
  LogFile(const std::string& path, const char* header = nullptr);
  ~LogFile();
  LogFile(LogFile&& o) noexcept;
  LogFile& operator=(LogFile&& o) noexcept;
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  template <class T>
  LogFile& operator<<(const T& v) {
    buf_ << v;
    return *this;
  }
  // Appends what was buffered in one write(2); throws st::Error on a short or failed write.
  void flush();
  // flush() and fsync(2): the lines are on disk.
  void sync();
  void close();  // flush() then close; throws like flush()

 private:
  int fd_ = -1;
  std::string path_;
  std::ostringstream buf_;
};

// Replaces `path` with `content` atomically and durably (temporary file, fsync, rename,
// fsync of the directory). Throws st::Error naming the file and errno; on failure the old
// file is untouched and the temporary file removed.
void write_file_atomic(const std::string& path, const std::string& content);

// Keeps the lines of `path` for which keep(line, index) is true, atomically
// (write_file_atomic). A last line without its newline (cut by a crash) is dropped. A
// missing file is left missing.
void rewrite_lines_atomic(const std::string& path,
                          const std::function<bool(const std::string&, size_t)>& keep);

// Exclusive lock on a run directory (RUN/train.lock, holding the PID of the process that
// holds it). The constructor throws st::Error when another live process holds it.
class RunDirLock {
 public:
  static constexpr const char* kFileName = "train.lock";
  explicit RunDirLock(const std::string& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// SIGINT/SIGTERM handling for the trainer. install() sets the handlers (SA_RESTART): the
// first signal is recorded, a second ends the process at once with 128+signal.
// uninstall() restores the previous handlers. pending() is the first signal's number or 0.
namespace stop_signal {
void install();
void uninstall();
int pending();
void clear();
}  // namespace stop_signal

}  // namespace st
