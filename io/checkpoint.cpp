// Checkpoint file format, version 3 (still read: version 2 = the same plus an elapsed_s
// record (f64, wall time), version 1 = version 2 without the hooks_state record). Version 3
// dropped elapsed_s so that identical training states give byte-identical files; rng_state
// and data_state are serialised field by field (Rng::State, DataLoader::State::to_bytes).
// All integers little-endian. Data-parallel runs add the records dist_world,
// optim_shards, shard_rank, shard_begin and shard_end (checkpoint.h); they are optional,
// written only when not at their defaults, so single-process files are unchanged (a build
// older than them refuses a data-parallel checkpoint as an unknown record).
//
//   header   magic "STCKPT01" (8 bytes), format version (u32: 3; 1 and 2 are read too)
//   records  repeated up to the trailer, one per CheckpointState field, in any order:
//              name length (u16, 1..64), name (ASCII, no terminator),
//              type (u8: 1 i32, 2 i64, 3 f32, 4 f64, 5 bytes, 6 string),
//              value length (u64), value (scalars: 4 or 8 LE bytes, floats as IEEE bits)
//   trailer  payload length (u64: bytes of header + records), then SHA-256 (32 bytes)
//            of everything before it (header, records and the payload length)
//
// Header and trailer layout are frozen across versions; later versions add records. The
// reader checks size, magic, trailer length, checksum, version, then the records: every
// field it knows exactly once with its type and length, no unknown names, consistent
// optimizer arrays. Structural errors are reported only after the checksum matched, so a
// damaged file always reads "corrupt". Then the values are checked (the rules are listed at
// the top of checkpoint_check.cpp); save_checkpoint checks only the structure (array sizes,
// shard fields). Big arrays are streamed in chunks and hashed in the same pass: no second
// in-memory copy of master/m/v on save or load.
#include "io/checkpoint.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "io/checkpoint_check.h"

namespace st {
namespace {

constexpr size_t kChunk = size_t(4) << 20;  // I/O and hashing granularity
constexpr size_t kMagicBytes = 8, kHeaderBytes = 12, kTrailerBytes = 40, kMaxName = 64;

enum class RecType : uint8_t { kI32 = 1, kI64 = 2, kF32 = 3, kF64 = 4, kBytes = 5, kString = 6 };

// The one list of fields, shared by writer and reader; the order is the order in the file.
template <class S, class F>
void visit_fields(S& s, F&& f) {
  f("config_yaml", s.config_yaml);
  f("step", s.step);
  f("adam_step", s.adam_step);
  f("n_layer", s.n_layer);
  f("n_head", s.n_head);
  f("n_embd", s.n_embd);
  f("max_seq_len", s.max_seq_len);
  f("vocab_size", s.vocab_size);
  f("padded_vocab_size", s.padded_vocab_size);
  f("compute", s.compute);
  f("master_elem_bytes", s.master_elem_bytes);
  f("master", s.master);
  f("m", s.m);
  f("v", s.v);
  f("loss_scale", s.loss_scale);
  f("loss_scale_good_steps", s.loss_scale_good_steps);
  f("rng_state", s.rng_state);
  f("data_state", s.data_state);
  f("elapsed_s", s.elapsed_s);      // versions 1..2 only
  f("hooks_state", s.hooks_state);  // since version 2
  f("dist_world", s.dist_world);    // optional (data-parallel runs)
  f("optim_shards", s.optim_shards);
  f("shard_rank", s.shard_rank);
  f("shard_begin", s.shard_begin);
  f("shard_end", s.shard_end);
}

// Whether format `version` has the record `name` (required unless is_optional).
bool in_version(const char* name, uint32_t version) {
  if (std::strcmp(name, "hooks_state") == 0) return version >= 2;
  if (std::strcmp(name, "elapsed_s") == 0) return version <= 2;
  return true;
}

// Optional records: absent means the default (checkpoint.h), and the writer leaves them out
// at their defaults.
bool is_optional(const char* name) {
  for (const char* n : {"dist_world", "optim_shards", "shard_rank", "shard_begin", "shard_end"})
    if (std::strcmp(name, n) == 0) return true;
  return false;
}
bool at_default(const char* name, const CheckpointState& s) {
  if (std::strcmp(name, "dist_world") == 0) return s.dist_world == 1;
  if (std::strcmp(name, "optim_shards") == 0) return s.optim_shards == 0;
  if (std::strcmp(name, "shard_rank") == 0) return s.shard_rank == -1;
  if (std::strcmp(name, "shard_begin") == 0 || std::strcmp(name, "shard_end") == 0)
    return s.shard_rank == -1 && s.shard_begin == 0 && s.shard_end == 0;
  return false;
}

// Same members in the same order: catches (most) fields added without updating the list.
struct Layout {
  std::string a;
  int64_t b[2];
  int32_t c[6];
  std::string d;
  int32_t e;
  std::vector<uint8_t> f[3];
  float g;
  int32_t h;
  std::vector<uint8_t> i[2];
  double j;
  std::vector<uint8_t> k;
  int32_t l[3];
  int64_t m[2];
};
static_assert(sizeof(CheckpointState) == sizeof(Layout),
              "CheckpointState changed: update visit_fields() and the format comment");

// A scalar field's record: the unsigned integer its bits travel as, and its record type.
template <class UInt, RecType kType>
struct ScalarRecord {
  using U = UInt;
  static constexpr RecType type = kType;
};
template <class T>
struct Scalar;
template <> struct Scalar<int32_t> : ScalarRecord<uint32_t, RecType::kI32> {};
template <> struct Scalar<int64_t> : ScalarRecord<uint64_t, RecType::kI64> {};
template <> struct Scalar<float> : ScalarRecord<uint32_t, RecType::kF32> {};
template <> struct Scalar<double> : ScalarRecord<uint64_t, RecType::kF64> {};

template <class U>
void put_le(uint8_t* p, U v) {
  for (size_t i = 0; i < sizeof(U); ++i) p[i] = uint8_t(v >> (8 * i));
}
template <class U>
U get_le(const uint8_t* p) {
  U v = 0;
  for (size_t i = 0; i < sizeof(U); ++i) v |= U(p[i]) << (8 * i);
  return v;
}

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      fail("sha256: EVP_DigestInit_ex failed");
  }
  void update(const void* p, size_t n) {
    if (n && EVP_DigestUpdate(ctx_.get(), p, n) != 1) fail("sha256: EVP_DigestUpdate failed");
  }
  std::array<uint8_t, 32> digest() {
    std::array<uint8_t, 32> d{};
    unsigned len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), d.data(), &len) != 1 || len != d.size())
      fail("sha256: EVP_DigestFinal_ex failed");
    return d;
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

std::string to_hex(const std::array<uint8_t, 32>& d) {
  static const char* digits = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = digits[d[i] >> 4];
    s[2 * i + 1] = digits[d[i] & 15];
  }
  return s;
}


struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// ---- writing ----

class Writer {
 public:
  Writer(int fd, const std::string& what) : fd_(fd), what_(what) { buf_.reserve(kSmall); }
  // Hashes and writes n bytes (also into `extra` when given). Small pieces are buffered.
  void put(const void* data, size_t n, Sha256* extra = nullptr) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    if (extra) extra->update(p, n);
    sha_.update(p, n);
    bytes_ += n;
    if (n <= kSmall) {
      if (buf_.size() + n > kSmall) flush();
      buf_.insert(buf_.end(), p, p + n);
      return;
    }
    flush();
    write_all(p, n);
  }
  void flush() {
    write_all(buf_.data(), buf_.size());
    buf_.clear();
  }
  uint64_t bytes() const { return bytes_; }
  std::array<uint8_t, 32> digest() { return sha_.digest(); }
  void put_unhashed(const void* p, size_t n) {
    flush();
    write_all(static_cast<const uint8_t*>(p), n);
  }

 private:
  static constexpr size_t kSmall = 64 << 10;
  void write_all(const uint8_t* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min(n, kChunk));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        fail_write(what_, ": write failed: ", w < 0 ? std::strerror(errno) : "wrote 0 bytes");
      p += w;
      n -= size_t(w);
    }
  }
  int fd_;
  std::string what_;
  std::vector<uint8_t> buf_;
  Sha256 sha_;
  uint64_t bytes_ = 0;
};

void put_record_header(Writer& w, const char* name, RecType type, uint64_t len) {
  const size_t nl = std::strlen(name);
  uint8_t h[2 + kMaxName + 1 + 8];
  put_le<uint16_t>(h, uint16_t(nl));
  std::memcpy(h + 2, name, nl);
  h[2 + nl] = uint8_t(type);
  put_le<uint64_t>(h + 3 + nl, len);
  w.put(h, 11 + nl);
}

template <class T>
void put_record(Writer& w, const char* name, const T& v, Sha256*) {
  typename Scalar<T>::U u;
  std::memcpy(&u, &v, sizeof u);
  uint8_t b[sizeof u];
  put_le(b, u);
  put_record_header(w, name, Scalar<T>::type, sizeof u);
  w.put(b, sizeof u);
}
void put_record(Writer& w, const char* name, const std::string& v, Sha256*) {
  put_record_header(w, name, RecType::kString, v.size());
  w.put(v.data(), v.size());
}
void put_record(Writer& w, const char* name, const std::vector<uint8_t>& v, Sha256* extra) {
  put_record_header(w, name, RecType::kBytes, v.size());
  w.put(v.data(), v.size(), extra);
}

// ---- reading ----

struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Sequential hashed reads of the payload [0, end).
class Reader {
 public:
  Reader(int fd, uint64_t end, const std::string& what) : fd_(fd), end_(end), what_(what) {}
  uint64_t remaining() const { return end_ - pos_; }
  void get(void* data, size_t n) {
    if (n > remaining()) throw FormatError("read past the end of the payload");
    uint8_t* p = static_cast<uint8_t*>(data);
    while (n > 0) {
      const size_t c = std::min(n, kChunk);
      pread_all(p, c, pos_);
      sha_.update(p, c);
      pos_ += c;
      p += c;
      n -= c;
    }
  }
  // Hashes the rest of the payload (after a format error, to tell corruption apart).
  void drain() {
    std::vector<uint8_t> buf(std::min<uint64_t>(kChunk, remaining()));
    while (remaining() > 0) get(buf.data(), std::min<uint64_t>(buf.size(), remaining()));
  }
  void pread_all(uint8_t* p, size_t n, uint64_t off) {
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, n, off_t(off));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(what_, ": read failed: ", std::strerror(errno));
      if (r == 0) fail(what_, ": truncated while reading (file shrank?)");
      p += r;
      off += uint64_t(r);
      n -= size_t(r);
    }
  }
  Sha256& sha() { return sha_; }

 private:
  int fd_;
  uint64_t end_, pos_ = 0;
  std::string what_;
  Sha256 sha_;
};

void check_type(const std::string& name, RecType got, RecType want) {
  if (got != want)
    throw FormatError("record '" + name + "' has type " + std::to_string(int(got)) + ", expected " +
                      std::to_string(int(want)));
}

template <class T>
void get_value(Reader& r, const std::string& name, RecType type, uint64_t len, T& v) {
  check_type(name, type, Scalar<T>::type);
  if (len != sizeof(T))
    throw FormatError("record '" + name + "' is " + std::to_string(len) + " bytes, expected " +
                      std::to_string(sizeof(T)));
  uint8_t b[sizeof(T)];
  r.get(b, sizeof b);
  auto u = get_le<typename Scalar<T>::U>(b);
  std::memcpy(&v, &u, sizeof v);
}
void get_value(Reader& r, const std::string& name, RecType type, uint64_t len, std::string& v) {
  check_type(name, type, RecType::kString);
  v.resize(len);  // len <= remaining payload: bounded by the file size
  r.get(v.data(), len);
}
void get_value(Reader& r, const std::string& name, RecType type, uint64_t len,
               std::vector<uint8_t>& v) {
  check_type(name, type, RecType::kBytes);
  v.resize(len);
  r.get(v.data(), len);
}

void parse_records(Reader& r, CheckpointState& s) {
  uint8_t hb[kHeaderBytes];  // magic (already checked) and version, through the hash
  r.get(hb, kHeaderBytes);
  const uint32_t version = get_le<uint32_t>(hb + kMagicBytes);
  if (version < 1 || version > kCheckpointVersion)
    throw FormatError("unsupported checkpoint format version " + std::to_string(version) +
                      " (this build reads versions 1.." + std::to_string(kCheckpointVersion) +
                      ")");
  size_t num_fields = 0;
  visit_fields(s, [&](const char*, auto&) { ++num_fields; });
  std::vector<bool> seen(num_fields, false);
  while (r.remaining() > 0) {
    uint8_t h[8];
    if (r.remaining() < 2) throw FormatError("record header runs past the end of the payload");
    r.get(h, 2);
    const uint16_t nl = get_le<uint16_t>(h);
    if (nl == 0 || nl > kMaxName)
      throw FormatError("record name length " + std::to_string(nl) + " (expected 1.." +
                        std::to_string(kMaxName) + ")");
    if (r.remaining() < uint64_t(nl) + 9)
      throw FormatError("record header runs past the end of the payload");
    std::string name(nl, '\0');
    r.get(name.data(), nl);
    uint8_t type;
    r.get(&type, 1);
    r.get(h, 8);
    const uint64_t len = get_le<uint64_t>(h);
    if (len > r.remaining())
      throw FormatError("record '" + name + "' length " + std::to_string(len) +
                        " runs past the end of the payload (" + std::to_string(r.remaining()) +
                        " bytes left)");
    size_t idx = 0;
    bool found = false;
    visit_fields(s, [&](const char* field_name, auto& field) {
      if (!found && name == field_name) {
        found = true;
        if (!in_version(field_name, version))
          throw FormatError("record '" + name + "' is not part of format version " +
                            std::to_string(version));
        if (seen[idx]) throw FormatError("duplicate record '" + name + "'");
        seen[idx] = true;
        get_value(r, name, RecType(type), len, field);
      }
      ++idx;
    });
    if (!found) throw FormatError("unknown record '" + name + "'");
  }
  size_t idx = 0;
  visit_fields(s, [&](const char* field_name, auto&) {
    const bool optional = !in_version(field_name, version) || is_optional(field_name);
    if (!seen[idx++] && !optional)
      throw FormatError(std::string("missing record '") + field_name + "'");
  });
}

}  // namespace

std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return to_hex(h.digest());
}

std::string save_checkpoint(const std::string& path, const CheckpointState& s) {
  const std::string bad = detail::check_arrays(s);
  if (!bad.empty()) fail("save_checkpoint: refusing to write ", path, ": ", bad);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const std::string what = "save_checkpoint: cannot write " + path + " (temporary " + tmp + ")";
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) fail(what, ": ", std::strerror(errno));
  Sha256 master_sha;
  try {
    Writer w(f.fd, what);
    uint8_t header[kHeaderBytes];
    std::memcpy(header, kCheckpointMagic, kMagicBytes);
    put_le<uint32_t>(header + kMagicBytes, kCheckpointVersion);
    w.put(header, sizeof header);
    visit_fields(s, [&](const char* name, const auto& v) {
      if (!in_version(name, kCheckpointVersion) || (is_optional(name) && at_default(name, s)))
        return;
      put_record(w, name, v, &v == static_cast<const void*>(&s.master) ? &master_sha : nullptr);
    });
    uint8_t len[8];
    put_le<uint64_t>(len, w.bytes());
    w.put(len, 8);
    const auto digest = w.digest();
    w.put_unhashed(digest.data(), digest.size());
    if (::fsync(f.fd) != 0) fail_write(what, ": fsync failed: ", std::strerror(errno));
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) fail_write(what, ": close failed: ", std::strerror(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail(what, ": rename over ", path, " failed: ", std::strerror(errno));
  } catch (...) {
    if (f.fd >= 0) ::close(f.fd);
    f.fd = -1;
    ::unlink(tmp.c_str());
    throw;
  }
  // The new file is in place; make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0 || ::fsync(d.fd) != 0)
    fail("save_checkpoint: wrote ", path, " but fsync of directory ", dir,
         " failed: ", std::strerror(errno));
  return to_hex(master_sha.digest());
}

CheckpointState load_checkpoint(const std::string& path) {
  const std::string what = "load_checkpoint: " + path;
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) fail(what, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail(what, ": fstat failed: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(what, ": not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  const uint64_t min_size = kHeaderBytes + kTrailerBytes;
  if (size < kMagicBytes)
    fail(what, ": truncated (", size, " bytes, a checkpoint has at least ", min_size, ")");
  Reader r(f.fd, size - std::min<uint64_t>(size, kTrailerBytes), what);
  uint8_t magic[kMagicBytes];
  r.pread_all(magic, kMagicBytes, 0);
  if (std::memcmp(magic, kCheckpointMagic, kMagicBytes) != 0)
    fail(what, ": not a stabletrain checkpoint (bad magic; expected \"", kCheckpointMagic, "\")");
  if (size < min_size)
    fail(what, ": truncated (", size, " bytes, a checkpoint has at least ", min_size, ")");
  uint8_t trailer[kTrailerBytes];
  r.pread_all(trailer, kTrailerBytes, size - kTrailerBytes);
  const uint64_t payload = get_le<uint64_t>(trailer);
  if (payload != size - kTrailerBytes)
    fail(what, ": truncated or damaged (trailer records ", payload, " payload bytes, file holds ",
         size - kTrailerBytes, ")");

  CheckpointState s;
  std::string format_error;
  try {
    parse_records(r, s);
  } catch (const FormatError& e) {
    format_error = e.what();
    r.drain();
  }
  r.sha().update(trailer, 8);
  const auto digest = r.sha().digest();
  if (std::memcmp(digest.data(), trailer + 8, digest.size()) != 0)
    fail(what, ": corrupt: SHA-256 mismatch (file damaged; use an earlier checkpoint)");
  if (!format_error.empty()) fail(what, ": ", format_error);
  const std::string bad = detail::check_arrays(s);
  if (!bad.empty()) fail(what, ": ", bad);
  detail::check_values(s, what);
  return s;
}

}  // namespace st
