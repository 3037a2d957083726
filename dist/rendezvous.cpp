// File and TCP rendezvous (dist/rendezvous.h). Message: magic "STRDV001", world (u32 LE),
// blob length (u32 LE), blob.
#include "dist/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "core/error.h"

namespace fs = std::filesystem;

namespace st {
namespace {

constexpr char kMagic[9] = "STRDV001";
constexpr uint32_t kMaxBlob = 1 << 20;

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<uint8_t> encode(int world, const std::vector<uint8_t>& blob) {
  std::vector<uint8_t> m(kMagic, kMagic + 8);
  for (uint32_t v : {static_cast<uint32_t>(world), static_cast<uint32_t>(blob.size())})
    for (int i = 0; i < 4; ++i) m.push_back(static_cast<uint8_t>(v >> (8 * i)));
  m.insert(m.end(), blob.begin(), blob.end());
  return m;
}

uint32_t get_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// The blob of a complete message, checked against this job's world size; `where` names the
// rendezvous in errors.
std::vector<uint8_t> decode(const std::vector<uint8_t>& m, int world, const std::string& where) {
  if (m.size() < 16 || std::memcmp(m.data(), kMagic, 8) != 0)
    fail(where, ": not a stabletrain rendezvous message");
  const uint32_t w = get_u32(m.data() + 8), n = get_u32(m.data() + 12);
  if (static_cast<int>(w) != world)
    fail(where, ": rank 0 published a job of ", w, " ranks, this job has ", world,
         " (a stale rendezvous of another job? use a fresh dist.rendezvous)");
  if (m.size() != 16 + size_t(n)) fail(where, ": truncated rendezvous message");
  return std::vector<uint8_t>(m.begin() + 16, m.end());
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Waits until fd is ready for `events` or the deadline passes (false).
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool send_all(int fd, const uint8_t* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return false;
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

bool recv_all(int fd, uint8_t* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}

void split_address(const std::string& address, std::string& host, std::string& port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size())
    fail("dist.rendezvous: '", address, "' is not host:port (e.g. node001:29500)");
  host = address.substr(0, colon);
  port = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "127.0.0.1";
}

}  // namespace

std::vector<uint8_t> rendezvous_file(const std::string& path, int rank, int world,
                                     const std::vector<uint8_t>& blob, double timeout_s) {
  ST_CHECK(!path.empty(), "dist.rendezvous: empty (the shared file for nccl_bootstrap: file)");
  const std::string where = "file rendezvous '" + path + "'";
  if (rank == 0) {
    ST_CHECK(blob.size() <= kMaxBlob, where, ": blob of ", blob.size(), " bytes");
    if (fs::exists(path))
      fail(where, ": the file already exists (left by an earlier job?); remove it or use a "
           "fresh path per job (e.g. with $SLURM_JOB_ID in it)");
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      const auto m = encode(world, blob);
      f.write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(m.size()));
      f.close();
      if (!f) fail(where, ": cannot write ", tmp, ": ", std::strerror(errno));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      fail(where, ": cannot rename ", tmp, ": ", std::strerror(e));
    }
    return blob;
  }
  const auto t0 = Clock::now();
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      const std::vector<uint8_t> m((std::istreambuf_iterator<char>(f)),
                                   std::istreambuf_iterator<char>());
      return decode(m, world, where);
    }
    if (since(t0) > timeout_s)
      fail("rank ", rank, " of ", world, ": ", where, " did not complete within dist.timeout_s = ",
           timeout_s, " s: rank 0 never wrote the file (is it running? is the path on a file "
           "system every node shares?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void rendezvous_file_done(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

std::vector<uint8_t> rendezvous_tcp(const std::string& address, int rank, int world,
                                    const std::vector<uint8_t>& blob, double timeout_s) {
  std::string host, port;
  split_address(address, host, port);
  const std::string where = "tcp rendezvous " + address;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  if (rank == 0) {
    ST_CHECK(blob.size() <= kMaxBlob, where, ": blob of ", blob.size(), " bytes");
    if (world == 1) return blob;
    char* end = nullptr;
    const long pn = std::strtol(port.c_str(), &end, 10);
    if (*end || pn <= 0 || pn > 65535) fail("dist.rendezvous: bad port in '", address, "'");
    Fd s;
    s.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s.fd < 0) fail(where, ": socket: ", std::strerror(errno));
    const int one = 1;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(pn));
    if (::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      fail(where, ": rank 0 cannot listen on port ", pn, ": ", std::strerror(errno));
    if (::listen(s.fd, world) != 0) fail(where, ": listen: ", std::strerror(errno));
    const auto m = encode(world, blob);
    int served = 0;
    while (served < world - 1) {
      if (!wait_fd(s.fd, POLLIN, deadline))
        fail("rank 0 of ", world, ": ", where, " did not complete within dist.timeout_s = ",
             timeout_s, " s: ", served, " of ", world - 1, " ranks connected");
      Fd c;
      c.fd = ::accept4(s.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c.fd < 0) continue;
      if (send_all(c.fd, m.data(), m.size(), deadline)) ++served;
    }
    return blob;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) fail(where, ": cannot resolve '", host, "': ", ::gai_strerror(gai));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
  std::string last = "no address";
  while (Clock::now() < deadline) {
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      Fd c;
      c.fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (c.fd < 0) continue;
      if (::connect(c.fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        last = std::strerror(errno);
        continue;
      }
      std::vector<uint8_t> head(16);
      if (!recv_all(c.fd, head.data(), 16, deadline)) {
        last = "connection closed before the id arrived";
        continue;
      }
      const uint32_t n = get_u32(head.data() + 12);
      if (std::memcmp(head.data(), kMagic, 8) != 0 || n > kMaxBlob)
        fail(where, ": something else answers on this port (not a stabletrain rank 0)");
      head.resize(16 + n);
      if (!recv_all(c.fd, head.data() + 16, n, deadline)) {
        last = "connection closed before the id arrived";
        continue;
      }
      return decode(head, world, where);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fail("rank ", rank, " of ", world, ": ", where, " did not complete within dist.timeout_s = ",
       timeout_s, " s: rank 0 never answered (last attempt: ", last, ")");
}

}  // namespace st
