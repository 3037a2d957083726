// The SIMT emulator's shared memory (simt.h, "shared memory"): the block's emulated space
// (dynamic shared memory first, then each static variable, with unaddressable redzones
// around every one; reset per block), the placement of the static variables and the
// driver's limits on them, the checker every access of the kernel code and of the PTX
// emulations passes through (bounds, bytes no thread wrote, races between barriers), the
// explicit reads and writes, and cp.async (copies issued, committed in groups and landed at
// cp.async.wait_group or at the thread's exit).
#include "simt/simt_internal.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

namespace simt {

using namespace detail;

namespace detail {

// ---------------------------------------------------------------- shared memory checks

void check_access(const Fiber* f, size_t off, size_t n, bool write) {
  Runtime& r = rt();
  if (r.failed) return;
  const uint32_t E = r.epoch, W = r.wepoch[f->warp];
  const int t = f->tid, w = f->warp;
  for (size_t i = 0; i < n; ++i) {
    const size_t a = off + i;
    const uint8_t s = a < kSmemSpace ? r.state[a] : 0;
    if (s == 0) {
      std::ostringstream o;
      o << where(f) << ": shared memory " << (write ? "write" : "read") << " of " << n
        << " bytes at offset " << off << " is out of bounds (byte " << a
        << " belongs to no shared variable; dynamic size " << r.dyn << ")";
      record_failure(cudaErrorIllegalAddress, o.str());
      return;
    }
    if (s == 3) {
      std::ostringstream o;
      o << where(f) << ": shared memory " << (write ? "write" : "read") << " of " << n
        << " bytes at offset " << off << " touches byte " << a
        << ", which a TMA copy in flight will write (wait on its mbarrier first)";
      record_failure(cudaErrorLaunchFailure, o.str());
      return;
    }
    if (!write && s == 1 && r.opts.check_uninit) {
      std::ostringstream o;
      o << where(f) << ": shared memory read of " << n << " bytes at offset " << off
        << " reads byte " << a << ", which no thread of this block has written";
      record_failure(cudaErrorLaunchFailure, o.str());
      return;
    }
    if (!r.opts.check_races) {
      if (write) r.state[a] = 2;
      continue;
    }
    Acc& c = r.acc[a];
    auto ordered = [&](int other, uint32_t other_w) {  // same warp, __syncwarp between
      return other / 32 == w && other_w != W;
    };
    const char* kind = nullptr;
    int other = -1;
    if (c.wt >= 0 && c.wt != t && c.we == E && !ordered(c.wt, c.ww)) {
      kind = write ? "write-write" : "write-read";
      other = c.wt;
    } else if (write && c.rt != -1 && c.re == E) {
      if (c.rt == -2) {
        if (!(c.rwarp == w && c.rw != W)) kind = "read-write (several readers)", other = -2;
      } else if (c.rt != t && !ordered(c.rt, c.rw)) {
        kind = "read-write";
        other = c.rt;
      }
    }
    if (kind) {
      std::ostringstream o;
      o << where(f) << ": shared memory race (" << kind << ") on byte " << a << " with thread ";
      if (other >= 0)
        o << other;
      else
        o << "(several)";
      o << ", with no __syncthreads between (epoch " << E << ")";
      record_failure(cudaErrorLaunchFailure, o.str());
      return;
    }
    if (write) {
      c.wt = static_cast<int16_t>(t);
      c.we = E;
      c.ww = W;
      c.rt = -1;
      r.state[a] = 2;
    } else if (c.rt == -1 || c.re != E) {
      c.rt = static_cast<int16_t>(t);
      c.re = E;
      c.rw = W;
      c.rwarp = static_cast<int16_t>(w);
    } else if (c.rt != t) {
      if (c.rwarp != w) c.rwarp = -1;
      c.rt = -2;
      c.rw = std::max(c.rw, W);
    } else {
      c.rw = std::max(c.rw, W);
    }
  }
}

size_t offset_of(const void* p) {
  return static_cast<size_t>(static_cast<const unsigned char*>(p) - rt().mem);
}

void reset_shared() {
  Runtime& r = rt();
  std::fill(r.state.begin(), r.state.begin() + static_cast<long>(r.used), 0);
  std::fill(r.acc.begin(), r.acc.begin() + static_cast<long>(r.used), Acc{-1, -1, -1, 0, 0, 0, 0});
  // dynamic shared memory first, after a redzone
  const size_t dyn_off = kRedzone;
  std::fill(r.state.begin() + dyn_off, r.state.begin() + static_cast<long>(dyn_off + r.dyn), 1);
  r.used = dyn_off + r.dyn + kRedzone;
  r.statics.clear();
  r.static_bytes = 0;
#if SIMT_ASAN
  ASAN_UNPOISON_MEMORY_REGION(r.mem, kSmemSpace);
  std::memset(r.mem, 0xA5, r.used);
  ASAN_POISON_MEMORY_REGION(r.mem, dyn_off);
  ASAN_POISON_MEMORY_REGION(r.mem + dyn_off + r.dyn, kSmemSpace - dyn_off - r.dyn);
#else
  std::memset(r.mem, 0xA5, r.used);  // garbage, as on the GPU
#endif
}

void complete_group(Fiber* f, const std::vector<Copy>& g) {
  Runtime& r = rt();
  for (const Copy& c : g) {
    unsigned char buf[16] = {};
    if (c.sz > 0) std::memcpy(buf, c.src, static_cast<size_t>(c.sz));
    check_access(f, c.dst, static_cast<size_t>(c.cp), true);
    if (r.failed) return;
    std::memcpy(r.mem + c.dst, buf, static_cast<size_t>(c.cp));
  }
}

}  // namespace detail

void* shared_static(const void* tag, size_t bytes, size_t align, const char* what) {
  Runtime& r = rt();
  if (!r.cur) {
    std::fprintf(stderr, "[simt] __shared__ variable %s used outside a kernel\n", what);
    std::abort();
  }
  for (auto& [t, off] : r.statics)
    if (t == tag) return r.mem + off;
  // the driver's accounting: static variables packed with their alignment
  const size_t start = (r.static_bytes + align - 1) / align * align;
  r.static_bytes = start + bytes;
  if (r.static_bytes > kMaxStaticSmem || r.static_bytes + r.dyn > r.limit) {
    std::ostringstream o;
    o << "launch of " << r.name << " fails: static shared memory " << r.static_bytes
      << " bytes (with " << what << ") + dynamic " << r.dyn << " bytes exceed "
      << (r.static_bytes > kMaxStaticSmem ? "the static limit 49152"
          : r.limit == kDefaultSmem       ? "49152 (48 KB; no cudaFuncSetAttribute opt-in)"
                                          : "the sm_90 maximum of 232448");
    record_failure(cudaErrorInvalidValue, o.str());
    yield(St::Exited);
  }
  const size_t off = (r.used + 127) / 128 * 128;
  if (off + bytes + kRedzone > kSmemSpace) std::abort();
  std::fill(r.state.begin() + static_cast<long>(off),
            r.state.begin() + static_cast<long>(off + bytes), 1);
#if SIMT_ASAN
  ASAN_UNPOISON_MEMORY_REGION(r.mem + off, bytes);
#endif
  r.used = off + bytes + kRedzone;
  r.statics.emplace_back(tag, off);
  return r.mem + off;
}

void* shared_dynamic(size_t align) {
  Runtime& r = rt();
  if (!r.cur) std::abort();
  if (align > 128) kernel_fail(where(r.cur) + ": dynamic shared memory aligned beyond 128");
  return r.mem + kRedzone;
}

uint32_t shared_address(const void* p) {
  Runtime& r = rt();
  const size_t off = offset_of(p);
  if (!r.cur || off >= r.used) {
    kernel_fail(where(r.cur) +
                ": __cvta_generic_to_shared of a pointer that is not in shared memory");
  }
  return static_cast<uint32_t>(off);
}

void shared_read(uint32_t addr, void* dst, size_t bytes) {
  Runtime& r = rt();
  check_access(r.cur, addr, bytes, false);
  if (r.failed) kernel_fail(r.last_failure);
  std::memcpy(dst, r.mem + addr, bytes);
}
void shared_write(uint32_t addr, const void* src, size_t bytes) {
  Runtime& r = rt();
  check_access(r.cur, addr, bytes, true);
  if (r.failed) kernel_fail(r.last_failure);
  std::memcpy(r.mem + addr, src, bytes);
}

void cp_async(uint32_t dst, const void* src, int cp_size, int src_size) {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  if (cp_size != 4 && cp_size != 8 && cp_size != 16) kernel_fail(where(f) + ": cp.async size");
  if (src_size < 0 || src_size > cp_size) kernel_fail(where(f) + ": cp.async src-size > cp-size");
  if (dst % static_cast<uint32_t>(cp_size) != 0 ||
      reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(cp_size) != 0) {
    kernel_fail(where(f) + ": cp.async addresses not aligned to " + std::to_string(cp_size) +
                " bytes");
  }
  f->uncommitted.push_back(Copy{dst, src, cp_size, src_size});
  // the source read counts as traffic; the thread waits for it at cp.async.wait_group
  if (rt().opts.count_traffic && src_size > 0)
    record_global(src, static_cast<size_t>(src_size), false,
                  reinterpret_cast<uintptr_t>(__builtin_return_address(0)), false);
}
void cp_async_commit() {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  f->groups.push_back(std::move(f->uncommitted));
  f->uncommitted.clear();
}
void cp_async_wait(int n) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  if (!f) std::abort();
  while (static_cast<int>(f->groups.size()) > n) {
    complete_group(f, f->groups.front());
    f->groups.pop_front();
    if (r.failed) kernel_fail(r.last_failure);
  }
}

}  // namespace simt
