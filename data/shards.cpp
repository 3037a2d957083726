#include "data/shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token shards are little-endian; this reader maps them in place"
#endif

namespace fs = std::filesystem;

namespace st {
namespace {

std::string prefix(const std::string& what, const std::string& path) {
  return (what.empty() ? "" : what + ": ") + path + ": ";
}

}  // namespace

void check_token_vocab(int64_t vocab, const std::string& what) {
  if (vocab < 1 || vocab > kMaxTokenVocab)
    fail(what, ": a vocabulary of ", vocab, " tokens does not fit the token format (ids are stored",
         " as uint16: at most ", kMaxTokenVocab, " tokens, ids 0..", kMaxTokenVocab - 1,
         "); use a vocabulary of at most ", kMaxTokenVocab, " tokens");
}

void write_token_shard(const std::string& path, const uint16_t* tokens, int64_t n) {
  ST_CHECK(n >= 0 && n <= kShardMaxTokens, "shard ", path, ": ", n, " tokens");
  int32_t header[256] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(n);
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot write token shard '", tmp, "': ", std::strerror(errno));
  bool ok = std::fwrite(header, sizeof header, 1, f) == 1 &&
            (n == 0 || std::fwrite(tokens, 2, static_cast<size_t>(n), f) == static_cast<size_t>(n));
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("cannot write token shard '", path, "': ", std::strerror(err));
  }
}

TokenShard TokenShard::open(const std::string& path, int vocab, const std::string& what) {
  const std::string at = prefix(what, path);
  // A FIFO or device is refused before open(): opening a FIFO blocks until a writer comes,
  // so `train` would hang. O_NONBLOCK covers a path swapped between stat() and open().
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(at, "not a regular file (",
         S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket",
         "); a token shard is a file written by prepare_data");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(at, "cannot open token shard: ", std::strerror(errno));
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(at, "not a regular file; a token shard is a file written by prepare_data");
  }
  const int64_t bytes = st.st_size;
  int32_t h[256] = {};
  const ssize_t got = bytes >= kShardHeaderBytes ? pread(fd, h, sizeof h, 0) : 0;
  if (bytes < kShardHeaderBytes || got != static_cast<ssize_t>(sizeof h)) {
    ::close(fd);
    fail(at, "truncated token shard: ", bytes, " bytes, less than the ", kShardHeaderBytes,
         "-byte header (re-create it with prepare_data)");
  }
  if (h[0] != kShardMagic) {
    ::close(fd);
    fail(at, "not an llm.c token shard: magic ", h[0], ", expected ", kShardMagic,
         h[0] == 20240326 ? " (this is an llm.c model file; use it as model.init_from)"
                          : " (text files are read with data.format: text)");
  }
  if (h[1] != kShardVersion) {
    ::close(fd);
    fail(at, "token shard version ", h[1], " is not supported (expected ", kShardVersion, ")");
  }
  const int64_t n = h[2];
  if (n < 0 || bytes != kShardHeaderBytes + 2 * n) {
    ::close(fd);
    fail(at, "token shard size mismatch: the header counts ", n, " tokens (", kShardHeaderBytes,
         " + 2 x ", n, " = ", kShardHeaderBytes + 2 * n, " bytes), the file has ", bytes,
         " bytes (", bytes < kShardHeaderBytes + 2 * n ? "truncated" : "trailing data",
         "; re-create it with prepare_data)");
  }
  TokenShard s;
  s.path_ = path;
  s.size_ = n;
  void* base = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (base == MAP_FAILED) fail(at, "cannot map token shard: ", std::strerror(map_err));
  const size_t len = static_cast<size_t>(bytes);
  s.map_ = std::shared_ptr<const void>(base, [len](const void* p) {
    munmap(const_cast<void*>(p), len);
  });
  s.tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(base) + kShardHeaderBytes);
  if (vocab > 0 && n > 0) {
    const uint16_t mx = *std::max_element(s.tokens_, s.tokens_ + n);
    if (mx >= vocab) {
      const int64_t i = std::find_if(s.tokens_, s.tokens_ + n, [&](uint16_t t) { return t >= vocab; }) - s.tokens_;
      fail(at, "token ", s.tokens_[i], " at index ", i, " is outside the vocabulary of ", vocab,
           " tokens (prepared with another tokenizer? check data.tokenizer)");
    }
  }
  return s;
}

bool is_token_shard(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;  // fopen of a FIFO would block
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  int32_t magic = 0;
  const bool ok = std::fread(&magic, 4, 1, f) == 1;
  std::fclose(f);
  return ok && magic == kShardMagic;
}

bool is_glob(const std::string& path) { return path.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> glob_files(const std::string& pattern) {
  std::vector<std::string> out;
  if (!is_glob(pattern)) {
    if (fs::exists(pattern)) out.push_back(pattern);
    return out;
  }
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

std::string shard_name(const std::string& pattern, int index) {
  const size_t star = pattern.find('*');
  if (star == std::string::npos) {
    ST_CHECK(index == 0, "output '", pattern, "' has no '*' for shard numbers, and the data "
             "needs more than one shard (add '*' to the name or raise the shard size)");
    return pattern;
  }
  ST_CHECK(pattern.find('*', star + 1) == std::string::npos, "output pattern '", pattern,
           "' has more than one '*'");
  char num[16];
  std::snprintf(num, sizeof num, "%06d", index);
  return pattern.substr(0, star) + num + pattern.substr(star + 1);
}

}  // namespace st
