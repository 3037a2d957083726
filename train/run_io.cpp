// Checked, crash-safe writes into a run directory; see run_io.h.
#include "train/run_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;

namespace st {

namespace {

std::string err_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

// Writes all n bytes (retrying short writes and EINTR); returns 0 or the errno.
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

void fsync_dir(const std::string& path) {
  const fs::path dir = fs::path(path).parent_path();
  const std::string d = dir.empty() ? "." : dir.string();
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open its directory to make the rename durable: ", err_text(errno));
  const int r = ::fsync(fd), e = errno;
  ::close(fd);
  if (r != 0) fail(path, ": fsync of its directory failed: ", err_text(e));
}

}  // namespace

// ---- LogFile ----

LogFile::LogFile(const std::string& path, const char* header) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot open for writing: ", err_text(errno));
  struct stat sb {};
  if (::fstat(fd_, &sb) != 0) fail(path, ": fstat failed: ", err_text(errno));
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail(path, ": is not a regular file (a log of the run directory must be one)");
  }
  if (header && sb.st_size == 0) {
    buf_ << header << "\n";
    flush();
  }
}

LogFile::~LogFile() {
  if (fd_ >= 0) ::close(fd_);  // unflushed lines are dropped: flush() reports errors, not ~
}

LogFile::LogFile(LogFile&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)), buf_(std::move(o.buf_)) {
  o.fd_ = -1;
}

LogFile& LogFile::operator=(LogFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    buf_ = std::move(o.buf_);
    o.fd_ = -1;
  }
  return *this;
}

void LogFile::flush() {
  if (fd_ < 0) fail("LogFile::flush: ", path_.empty() ? "(no file)" : path_, " is not open");
  const std::string s = buf_.str();
  buf_.str("");
  buf_.clear();
  if (s.empty()) return;
  if (const int e = write_all(fd_, s.data(), s.size()))
    fail_write(path_, ": write failed: ", err_text(e), "; the run stops");
}

void LogFile::sync() {
  flush();
  if (::fsync(fd_) != 0) fail_write(path_, ": fsync failed: ", err_text(errno));
}

void LogFile::close() {
  if (fd_ < 0) return;
  flush();
  const int r = ::close(fd_), e = errno;
  fd_ = -1;
  if (r != 0) fail_write(path_, ": close failed: ", err_text(e));
}

// ---- whole-file replacement ----

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, ": cannot create: ", err_text(errno));
  int e = write_all(fd, content.data(), content.size());
  if (!e && ::fsync(fd) != 0) e = errno;
  if (::close(fd) != 0 && !e) e = errno;
  if (!e && ::rename(tmp.c_str(), path.c_str()) != 0) e = errno;
  if (e) {
    ::unlink(tmp.c_str());
    fail_write(path, ": writing it (through ", tmp, ") failed: ", err_text(e),
         "; the old file is unchanged");
  }
  fsync_dir(path);
}

void rewrite_lines_atomic(const std::string& path,
                          const std::function<bool(const std::string&, size_t)>& keep) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  if (!fs::is_regular_file(path, ec)) fail(path, ": is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open for reading: ", err_text(errno));
  std::string out, line;
  size_t i = 0;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline: a line cut by a crash
    if (keep(line, i++)) out.append(line).push_back('\n');
  }
  if (in.bad()) fail(path, ": read failed: ", err_text(errno));
  in.close();
  write_file_atomic(path, out);
}

// ---- run-directory lock ----

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// The PID of the process holding an flock(2) on the file (dev, ino), as the kernel lists it
// in /proc/locks ("1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF", device
// numbers in hex); "" when not listed. Where the device numbers differ from stat's (overlay
// file systems), a single lock on that inode number is taken.
std::string flock_holder(dev_t dev, ino_t ino) {
  std::ifstream f("/proc/locks");
  std::string exact, same_inode;
  int same_inode_count = 0;
  for (std::string line; std::getline(f, line);) {
    std::istringstream is(line);
    std::string idx, kind, adv, mode, pid, id;
    if (!(is >> idx >> kind) || kind != "FLOCK") continue;  // ("->": a waiter)
    if (!(is >> adv >> mode >> pid >> id) || !all_digits(pid) || pid == "0") continue;
    unsigned maj = 0, min = 0;
    unsigned long long inode = 0;
    if (std::sscanf(id.c_str(), "%x:%x:%llu", &maj, &min, &inode) != 3 || inode != ino) continue;
    if (maj == major(dev) && min == minor(dev)) exact = pid;
    same_inode = pid;
    ++same_inode_count;
  }
  return !exact.empty() ? exact : same_inode_count == 1 ? same_inode : "";
}

// The PID the lock file records ("" if none yet or not a number).
std::string recorded_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return all_digits(pid) ? pid : "";
}

}  // namespace

RunDirLock::RunDirLock(const std::string& dir) {
  const std::string path = (fs::path(dir) / kFileName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot open the run directory's lock file: ", err_text(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    // Who holds it: the kernel's lock table first (the file may still hold an earlier
    // run's PID: the holder writes its own just after taking the lock); else the file,
    // given the holder a moment to write it (two processes started together).
    std::string pid;
    struct stat st {};
    for (int i = 0; e == EWOULDBLOCK && pid.empty() && i < 50; ++i) {
      if (i) ::usleep(20000);
      if (::fstat(fd_, &st) == 0) pid = flock_holder(st.st_dev, st.st_ino);
      if (pid.empty() && i == 49) pid = recorded_pid(fd_);
    }
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK)
      fail("run directory '", dir, "' is in use by another train process",
           pid.empty() ? std::string(" (its PID is not in /proc/locks nor in ") + path + ")"
                       : " (PID " + pid + ")",
           "; wait for it to end or stop it (kill -TERM writes a checkpoint) before starting, "
           "resuming or overwriting this run");
    fail(path, ": flock failed: ", err_text(e));
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || write_all(fd_, me.data(), me.size()) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    fail(path, ": cannot write the lock holder's PID: ", err_text(e));
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock; the file stays (harmless when unlocked)
}

// ---- stop signals ----

namespace stop_signal {
namespace {
volatile std::sig_atomic_t g_pending = 0;
struct sigaction g_old_int, g_old_term;
bool g_installed = false;

extern "C" void on_stop_signal(int sig) {
  if (g_pending) {  // the second signal: end now
    static const char msg[] = "train: second stop signal: exiting at once (no checkpoint)\n";
    ssize_t r = ::write(2, msg, sizeof msg - 1);
    (void)r;
    ::_exit(128 + sig);
  }
  g_pending = sig;
}
}  // namespace

void install() {
  if (g_installed) return;
  g_pending = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  g_installed = true;
}

void uninstall() {
  if (!g_installed) return;
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

int pending() { return g_pending; }
void clear() { g_pending = 0; }
}  // namespace stop_signal

}  // namespace st
