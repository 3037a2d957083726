// SIMT emulator runtime (see simt.h for the model). Compiled WITHOUT -fsanitize=thread: it
// implements the __tsan_* hooks that the instrumented kernel sources call on every memory
// access, and checks the ones that land in the running block's shared memory.
#include "simt/simt.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <boost/context/detail/fcontext.hpp>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define SIMT_ASAN 1
#else
#define SIMT_ASAN 0
#endif

namespace simt {

ThreadRegs* g_regs = nullptr;

namespace {

// Context switches: Boost.Context's fcontext primitives (the assembly switch behind
// boost::context::fiber, used directly as folly's fibers do): a switch saves the callee-saved
// registers and swaps stacks, with no system call (swapcontext's sigprocmask per switch cost
// a third of the emulator's time). Each fiber owns its stack below; nothing is unwound when a
// failed launch abandons fibers.
using boost::context::detail::fcontext_t;
using boost::context::detail::jump_fcontext;
using boost::context::detail::make_fcontext;
using boost::context::detail::transfer_t;

constexpr size_t kStackBytes = 512 * 1024;
constexpr size_t kSmemSpace = 1 << 20;        // emulated shared address space per block
constexpr size_t kRedzone = 256;              // unaddressable bytes around every variable
constexpr size_t kDefaultSmem = 48 * 1024;    // without cudaFuncSetAttribute
constexpr size_t kMaxSmemOptin = 227 * 1024;  // sm_90, static + dynamic, per block
constexpr size_t kMaxStaticSmem = 48 * 1024;

enum class St { Ready, Bar, Warp, Exited, Named, MBar };
enum class Op { None, SyncWarp, Shfl, Vote, Ldm, Mma, Wgmma, WgCommit, WgWait };

const char* op_name(Op op) {
  switch (op) {
    case Op::SyncWarp:
      return "__syncwarp";
    case Op::Shfl:
      return "__shfl_*_sync";
    case Op::Vote:
      return "__ballot/__any/__all_sync";
    case Op::Ldm:
      return "ldmatrix";
    case Op::Mma:
      return "mma.sync";
    case Op::Wgmma:
      return "wgmma.mma_async";
    case Op::WgCommit:
      return "wgmma.commit_group";
    case Op::WgWait:
      return "wgmma.wait_group";
    default:
      return "?";
  }
}

struct Copy {
  uint32_t dst;
  const void* src;
  int cp, sz;
};

struct Fiber {
  fcontext_t ctx = nullptr;  // where the fiber resumes
  void* stack = nullptr;
  ThreadRegs regs{};
  int tid = 0, warp = 0, lane = 0;
  St st = St::Ready;
  // the collective this thread waits at
  Op op = Op::None;
  unsigned mask = 0;
  Shfl mode = Shfl::Idx;
  int arg = 0, width = 32, bytes = 0, vop = 0;
  bool flag = false;  // vote predicate / ldmatrix trans / mma bf16
  int bar_pred = 0, bar_op = 0;
  alignas(16) unsigned char in[48]{};
  alignas(16) unsigned char out[32]{};
  std::vector<Copy> uncommitted;
  std::deque<std::vector<Copy>> groups;
  // traffic counting: per instruction address, how often this thread executed it; the
  // loads of the current stretch between switch points; the rounds so far (U = 2^k)
  std::unordered_map<uintptr_t, uint32_t> occ;
  uint32_t stretch_loads = 0;
  // the thread's last global access, which the next one may extend (see record_global)
  uint64_t last_end[2] = {0, 0};  // [read, write]
  bool last_valid[2] = {false, false};
  uint64_t rounds[LaunchTraffic::kRoundWidths] = {};
  // Hopper: the wgmma this lane issues; the named barrier / mbarrier it waits at
  float* wg_d = nullptr;
  const uint32_t* wg_a = nullptr;  // A registers (register-A form)
  uint64_t wg_da = 0, wg_db = 0;
  int wg_n = 0, wg_tnsp_a = 0, wg_tnsp_b = 0;
  bool wg_rs = false, wg_scale_d = false;
  int nbar = -1;
  uint32_t mbar = 0, mbar_parity = 0;
  // ---- compute-side counts (issue 43): the thread's last shared access, which the next one
  // may extend (as last_end does for global ones; see record_shared)
  uint64_t sh_last_end = 0;
  bool sh_last_valid = false, sh_last_write = false;
  uintptr_t sh_last_pc = 0;
  uint32_t sh_last_occ = 0;
};

// One warp's share of a wgmma (its 16 rows of D), as issued.
struct WgOp {
  bool rs = false, bf16 = true, scale_d = true;
  int n = 0, tnsp_a = 0, tnsp_b = 0, wig = 0;  // wig: the warp's index in its warpgroup
  uint64_t da = 0, db = 0;
  uint32_t a[32][4] = {};
  const uint32_t* ap[32] = {};  // where each lane's A registers live (unchanged until it runs)
  float* d[32] = {};
  std::vector<float> c;  // the accumulators at issue (32 x n/2): unchanged until it runs
  bool chained = false;  // an earlier wgmma in flight writes the same accumulators
};
// A TMA copy in flight: lands (and completes its bytes on the barrier) when a thread waits.
struct TmaCopy {
  uint32_t dst = 0;
  TensorMap map;
  int coords[3] = {0, 0, 0};
};
struct MBar {
  uint32_t expected = 0, pending = 0, phase = 0;
  int64_t tx = 0;
  std::vector<TmaCopy> copies;
  std::vector<int> waiters;  // fibers waiting for a phase to complete
};
struct NamedBar {
  int count = 0, arrived = 0;
  std::vector<int> waiting;
};

// One warp request: the n-th execution of one instruction by the lanes of one warp.
struct ReqKey {
  uintptr_t pc;
  uint32_t occ;
  int32_t warp;
  bool write;
  bool operator==(const ReqKey& o) const {
    return pc == o.pc && occ == o.occ && warp == o.warp && write == o.write;
  }
};
struct ReqHash {
  size_t operator()(const ReqKey& k) const {
    uint64_t h = k.pc * 0x9E3779B97F4A7C15ull ^ (uint64_t{k.occ} << 20) ^
                 (static_cast<uint64_t>(k.warp) << 1) ^ static_cast<uint64_t>(k.write);
    h ^= h >> 29;
    return static_cast<size_t>(h * 0xBF58476D1CE4E5B9ull);
  }
};

// Race record of one shared byte.
struct Acc {
  int16_t wt, rt;   // writer / reader thread (-1 none, rt -2: several readers)
  int16_t rwarp;    // the readers' warp when they are all in one, else -1
  uint32_t we, ww;  // block epoch, writer's warp epoch
  uint32_t re, rw;  // block epoch, largest warp epoch of the readers
};

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Runtime {
  Options opts;
  Stats stats;
  std::string last_failure, err_text;
  uint64_t failures = 0;
  cudaError_t last_error = cudaSuccess;
  std::map<const void*, int> max_dyn;  // cudaFuncSetAttribute

  // traffic of the launch in progress (Options::count_traffic)
  std::vector<LaunchTraffic> tlog;
  LaunchTraffic tcur;
  std::unordered_map<ReqKey, std::vector<uint64_t>, ReqHash> reqs;  // this block's requests
  std::unordered_set<uint64_t> rd_set, wr_set;                       // this launch's sectors
  std::unordered_set<uint64_t> blk_rd;                               // this block's reads
  uint64_t math_calls[4] = {};
  // ---- compute-side counts (issue 43): this block's generic shared requests (4-byte words)
  std::unordered_map<ReqKey, std::vector<uint32_t>, ReqHash> sreqs;
  LaunchTraffic::BlockCounts bsum{};  // the counts at the end of the previous block
  const char* host_lo = nullptr;  // the launching thread's stack: never device memory
  const char* host_hi = nullptr;

  // the launch in progress
  bool active = false, failed = false;
  const char* name = "";
  const std::function<void()>* body = nullptr;
  dim3 grid, block;
  size_t dyn = 0, limit = kDefaultSmem;
  uint3 bidx{};

  // the block in progress
  std::vector<Fiber> fibers;
  std::vector<void*> stacks;
  int nthreads = 0, live = 0, at_bar = 0;
  uint32_t epoch = 1;
  std::vector<uint32_t> wepoch;
  std::vector<uint32_t> wwait, wexit;  // per warp: lanes waiting at a collective, exited
  std::vector<int> ready;
  uint64_t rng = 0;
  fcontext_t sched = nullptr;  // where the scheduler resumes (valid while a fiber runs)
  Fiber* cur = nullptr;
#if SIMT_ASAN
  void* sched_fake = nullptr;
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
#endif

  // shared memory of the block
  unsigned char* mem = nullptr;
  std::vector<uint8_t> state;  // 0 unaddressable, 1 allocated, 2 written
  std::vector<Acc> acc;
  size_t used = 0, static_bytes = 0;
  std::vector<std::pair<const void*, size_t>> statics;

  // Hopper state of the block in progress
  std::vector<std::vector<WgOp>> wg_unc;                // per warp: issued, not committed
  std::vector<std::deque<std::vector<WgOp>>> wg_groups;  // per warp: committed groups
  std::vector<uint64_t> wg_issued;                      // per warp: wgmma instructions
  std::map<uint32_t, MBar> mbars;
  NamedBar nbars[16];

  Runtime() {
    mem = static_cast<unsigned char*>(std::aligned_alloc(4096, kSmemSpace));
    state.assign(kSmemSpace, 0);
    acc.resize(kSmemSpace);
    fibers.resize(1024);
  }
};

Runtime& rt() {
  static Runtime* r = new Runtime;  // never destroyed: hooks may run during exit
  return *r;
}

void end_stretch(Fiber* f);
void end_block_traffic();
void record_global(const void* p, size_t n, bool write, uintptr_t pc, bool blocking);
void record_shared(size_t off, size_t n, bool write, uintptr_t pc);
void count_collective(Op op, Fiber* base);
void end_block_compute();

std::string where(const Fiber* f) {
  Runtime& r = rt();
  std::ostringstream o;
  o << "kernel " << r.name << ", block (" << r.bidx.x << "," << r.bidx.y << "," << r.bidx.z << ")";
  if (f) {
    o << ", thread (" << f->regs.thread_idx.x << "," << f->regs.thread_idx.y << ","
      << f->regs.thread_idx.z << ") [warp " << f->warp << " lane " << f->lane << "]";
  }
  return o.str();
}

void record_failure(cudaError_t code, const std::string& msg) {
  Runtime& r = rt();
  if (r.failed) return;
  r.failed = true;
  r.last_error = code;
  r.last_failure = msg;
  ++r.failures;
  std::fprintf(stderr, "[simt] %s\n", msg.c_str());
}

// ---------------------------------------------------------------- fibers

void switch_to(Fiber* f) {
  Runtime& r = rt();
  r.cur = f;
  g_regs = &f->regs;
  ++r.stats.switches;
#if SIMT_ASAN
  __sanitizer_start_switch_fiber(&r.sched_fake, f->stack, kStackBytes);
#endif
  f->ctx = jump_fcontext(f->ctx, nullptr).fctx;  // back when the fiber yields
#if SIMT_ASAN
  __sanitizer_finish_switch_fiber(r.sched_fake, nullptr, nullptr);  // back on the scheduler
#endif
  r.cur = nullptr;
  g_regs = nullptr;
}

// From the running fiber back to the scheduler, in state s.
void yield(St s) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  f->st = s;
#if SIMT_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(s == St::Exited ? nullptr : &fake, r.sched_bottom, r.sched_size);
#endif
  r.sched = jump_fcontext(r.sched, nullptr).fctx;  // back when the scheduler resumes us
#if SIMT_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  // resumed by the scheduler (never after a failure: failed launches abandon fibers)
}

void complete_group(Fiber* f, const std::vector<Copy>& g);

void fiber_entry(transfer_t from) {
  Runtime& r = rt();
  r.sched = from.fctx;
#if SIMT_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &r.sched_bottom, &r.sched_size);
#endif
  Fiber* f = r.cur;
  try {
    (*r.body)();
  } catch (const std::exception& e) {
    record_failure(cudaErrorLaunchFailure, where(f) + ": exception in device code: " + e.what());
    yield(St::Exited);
  }
  // Copies still in flight land before the thread is gone (as on the GPU, eventually).
  if (!f->uncommitted.empty()) f->groups.push_back(std::move(f->uncommitted));
  while (!f->groups.empty() && !r.failed) {
    complete_group(f, f->groups.front());
    f->groups.pop_front();
  }
  yield(St::Exited);
  std::abort();  // an exited fiber is never resumed
}

void* stack_for(int i) {
  Runtime& r = rt();
  while (static_cast<int>(r.stacks.size()) <= i) {
    void* p = mmap(nullptr, kStackBytes + 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "[simt] mmap of a fiber stack failed\n");
      std::abort();
    }
    mprotect(p, 4096, PROT_NONE);  // guard page: a stack overflow faults
    r.stacks.push_back(static_cast<char*>(p) + 4096);
  }
  return r.stacks[i];
}

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

// ---------------------------------------------------------------- collectives

bool in_mask(unsigned mask, int lane) {
  return (mask >> lane) & 1u;
}

void exec_shfl(Fiber* base, unsigned mask) {
  for (int l = 0; l < 32; ++l) {
    if (!in_mask(mask, l)) continue;
    Fiber& f = base[l];
    const int width = f.width;
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
      kernel_fail(where(&f) + ": shfl width " + std::to_string(width) +
                  " is not a power of 2 <= 32");
    }
    const int seg = l & ~(width - 1);
    int src = l;
    switch (f.mode) {
      case Shfl::Idx:
        src = seg + (f.arg & (width - 1));
        break;
      case Shfl::Up:
        src = l - f.arg < seg ? l : l - f.arg;
        break;
      case Shfl::Down:
        src = l + f.arg >= seg + width ? l : l + f.arg;
        break;
      case Shfl::Xor:
        src = l ^ f.arg;
        if (src < seg || src >= seg + width) src = l;
        break;
    }
    if (src < 0 || src > 31 || !in_mask(mask, src)) {
      kernel_fail(where(&f) + ": shfl reads lane " + std::to_string(src) +
                  ", which is not in the mask (undefined on the GPU)");
    }
    std::memcpy(f.out, base[src].in, 8);
  }
}

void exec_vote(Fiber* base, unsigned mask) {
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l)
    if (in_mask(mask, l) && base[l].flag) ballot |= 1u << l;
  for (int l = 0; l < 32; ++l) {
    if (!in_mask(mask, l)) continue;
    unsigned v = ballot;
    if (base[l].vop == 1) v = ballot != 0;
    if (base[l].vop == 2) v = ballot == mask;
    std::memcpy(base[l].out, &v, 4);
  }
}

void exec_ldmatrix(Fiber* base) {
  const int num = base[0].arg;
  const bool trans = base[0].flag;
  for (int l = 1; l < 32; ++l) {
    if (base[l].arg != num || base[l].flag != trans) {
      kernel_fail(where(&base[l]) + ": ldmatrix with another shape than lane 0 in the same warp");
    }
  }
  // rows[i][r]: the 16 bytes of row r of matrix i, read by the lane that gave its address
  uint16_t rows[4][8][8];
  for (int i = 0; i < num; ++i) {
    for (int rr = 0; rr < 8; ++rr) {
      Fiber& f = base[8 * i + rr];
      uint32_t addr;
      std::memcpy(&addr, f.in, 4);
      if (addr % 16 != 0) {
        kernel_fail(where(&f) + ": ldmatrix row address " + std::to_string(addr) +
                    " is not 16-byte aligned");
      }
      check_access(&f, addr, 16, false);  // the read is this lane's
      if (rt().failed) throw std::runtime_error(rt().last_failure);
      std::memcpy(rows[i][rr], rt().mem + addr, 16);
    }
  }
  for (int l = 0; l < 32; ++l) {
    uint32_t reg[4] = {0, 0, 0, 0};
    const int g = l / 4, c = l % 4;
    for (int i = 0; i < num; ++i) {
      uint16_t lo, hi;
      if (!trans) {
        lo = rows[i][g][2 * c];
        hi = rows[i][g][2 * c + 1];
      } else {
        lo = rows[i][2 * c][g];
        hi = rows[i][2 * c + 1][g];
      }
      reg[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    std::memcpy(base[l].out, reg, 16);
  }
}

double half_value(uint16_t h, bool bf16) {
  if (bf16) return static_cast<double>(__uint_as_float(static_cast<uint32_t>(h) << 16));
  return static_cast<double>(f16_to_f32(h));
}

// D = A (16x16) B (16x8) + C with the PTX ISA's m16n8k16 fragment layouts (simt.h / README):
// g = lane / 4, c = lane % 4;
//   A regs: {A[g][2c],A[g][2c+1]}, {A[g+8][2c],..}, {A[g][2c+8],..}, {A[g+8][2c+8],..}
//   B regs: {B[2c][g],B[2c+1][g]}, {B[2c+8][g],B[2c+9][g]}
//   C/D:    D[g][2c], D[g][2c+1], D[g+8][2c], D[g+8][2c+1]
// Accumulation: the 16 products are exact in FP64 and summed in FP64 with C, then rounded
// once to FP32. (Real tensor cores align and truncate partial sums; results may differ in
// the last bits, which is why the flash tests compare with tolerances.)
void exec_mma(Fiber* base) {
  const bool bf16 = base[0].flag;
  double A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    Fiber& f = base[l];
    if (f.flag != bf16) kernel_fail(where(&f) + ": mma.sync with mixed input types in one warp");
    uint32_t a[4], b[2];
    float c[4];
    std::memcpy(a, f.in, 16);
    std::memcpy(b, f.in + 16, 8);
    std::memcpy(c, f.in + 24, 16);
    const int g = l / 4, t = l % 4;
    const int ar[4] = {g, g + 8, g, g + 8}, ac[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; ++i) {
      A[ar[i]][ac[i]] = half_value(static_cast<uint16_t>(a[i] & 0xffff), bf16);
      A[ar[i]][ac[i] + 1] = half_value(static_cast<uint16_t>(a[i] >> 16), bf16);
    }
    for (int i = 0; i < 2; ++i) {
      B[2 * t + 8 * i][g] = half_value(static_cast<uint16_t>(b[i] & 0xffff), bf16);
      B[2 * t + 8 * i + 1][g] = half_value(static_cast<uint16_t>(b[i] >> 16), bf16);
    }
    C[g][2 * t] = c[0];
    C[g][2 * t + 1] = c[1];
    C[g + 8][2 * t] = c[2];
    C[g + 8][2 * t + 1] = c[3];
  }
  float D[16][8];
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      double s = C[i][j];
      for (int k = 0; k < 16; ++k) s += A[i][k] * B[k][j];
      D[i][j] = static_cast<float>(s);
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const float d[4] = {D[g][2 * t], D[g][2 * t + 1], D[g + 8][2 * t], D[g + 8][2 * t + 1]};
    std::memcpy(base[l].out, d, 16);
  }
}

void exec_wgmma(Fiber* base, int warp);
void wgmma_retire(int warp, int keep);
void hopper_block_end();

void mismatch(const Fiber& o, int l, const Fiber& f) {
  kernel_fail(where(&o) + ": lane arrives at " + op_name(o.op) + " (mask " +
              std::to_string(o.mask) + ") while lane " + std::to_string(l) + " waits at " +
              op_name(f.op) + " (mask " + std::to_string(f.mask) + ")");
}

uint32_t bit(int lane) {
  return 1u << lane;
}

// Lane `a` of `warp` has just arrived at a collective, or exited. Only a group that names `a`
// can change state, and a group completes when its last lane arrives, so each event is
// checked against the waiting lanes it concerns, with per-warp bit sets of the waiting and
// exited lanes (a scan of every waiting lane's group per event cost O(32^2)).
//
// Invariant: two waiting lanes where one names the other wait at the same collective with
// the same mask. An arriving lane with mask M keeps it if it matches one waiting lane of M
// (which names every other waiting lane of M, so they all match it) and no waiting lane
// outside M names it (such a lane's mask differs from M).
void warp_event(int warp, int a) {
  Runtime& r = rt();
  const int first = warp * 32;
  const int nl = std::min(32, r.nthreads - first);
  Fiber* base = &r.fibers[first];
  Fiber& fa = base[a];
  uint32_t& waiting = r.wwait[warp];
  if (fa.st == St::Exited) {
    r.wexit[warp] |= bit(a);
    for (uint32_t w = waiting; w; w &= w - 1) {
      const Fiber& f = base[__builtin_ctz(w)];
      if (in_mask(f.mask, a)) {
        kernel_fail(where(&f) + ": " + op_name(f.op) + " waits for lane " + std::to_string(a) +
                    ", which has exited");
      }
    }
    return;
  }
  const unsigned mask = fa.mask;
  if (!in_mask(mask, a)) {
    kernel_fail(where(&fa) + ": " + op_name(fa.op) + " with a mask that does not name this lane");
  }
  if ((fa.op == Op::Ldm || fa.op == Op::Mma || fa.op == Op::Wgmma || fa.op == Op::WgCommit ||
       fa.op == Op::WgWait) &&
      mask != 0xffffffffu) {
    kernel_fail(where(&fa) + ": " + op_name(fa.op) + " needs all 32 lanes of the warp");
  }
  const uint32_t lanes = nl == 32 ? 0xffffffffu : bit(nl) - 1;
  if (mask & ~lanes) {
    kernel_fail(where(&fa) + ": " + op_name(fa.op) + " names lane " +
                std::to_string(__builtin_ctz(mask & ~lanes)) + ", which does not exist (block of " +
                std::to_string(r.nthreads) + ")");
  }
  if (mask & r.wexit[warp]) {
    kernel_fail(where(&fa) + ": " + op_name(fa.op) + " waits for lane " +
                std::to_string(__builtin_ctz(mask & r.wexit[warp])) + ", which has exited");
  }
  for (uint32_t w = waiting & ~mask; w; w &= w - 1) {
    const int l = __builtin_ctz(w);
    if (in_mask(base[l].mask, a)) mismatch(fa, l, base[l]);
  }
  if (const uint32_t in = waiting & mask) {
    const int l = __builtin_ctz(in);
    if (base[l].op != fa.op || base[l].mask != mask) mismatch(fa, l, base[l]);
  }
  waiting |= bit(a);
  if ((mask & ~waiting) != 0) return;  // not complete yet
  if (r.opts.count_traffic) count_collective(fa.op, base);
  switch (fa.op) {
    case Op::SyncWarp:
      ++r.wepoch[warp];
      break;
    case Op::Shfl:
      exec_shfl(base, mask);
      break;
    case Op::Vote:
      exec_vote(base, mask);
      break;
    case Op::Ldm:
      exec_ldmatrix(base);
      break;
    case Op::Mma:
      exec_mma(base);
      break;
    case Op::Wgmma:
      exec_wgmma(base, warp);
      break;
    case Op::WgCommit:
      r.wg_groups[warp].push_back(std::move(r.wg_unc[warp]));
      r.wg_unc[warp].clear();
      break;
    case Op::WgWait:
      wgmma_retire(warp, fa.arg);
      break;
    default:
      break;
  }
  waiting &= ~mask;
  for (uint32_t w = mask; w; w &= w - 1) {
    const int m = __builtin_ctz(w);
    base[m].st = St::Ready;
    base[m].op = Op::None;
    r.ready.push_back(first + m);
  }
}

// Called by a thread: wait at a warp collective until the warp completes it.
void warp_wait(Op op, unsigned mask) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  if (!f) {
    std::fprintf(stderr, "[simt] a warp collective outside a kernel launch\n");
    std::abort();
  }
  f->op = op;
  f->mask = mask;
  yield(St::Warp);
}

void release_barrier() {
  Runtime& r = rt();
  int agg[3] = {0, 1, 0};  // count, and, or
  for (int i = 0; i < r.nthreads; ++i) {
    Fiber& f = r.fibers[i];
    if (f.st != St::Bar) continue;
    agg[0] += f.bar_pred != 0;
    agg[1] &= f.bar_pred != 0;
    agg[2] |= f.bar_pred != 0;
  }
  ++r.epoch;
  if (r.opts.count_traffic) ++r.tcur.barriers;
  for (int i = 0; i < r.nthreads; ++i) {
    Fiber& f = r.fibers[i];
    if (f.st != St::Bar) continue;
    f.bar_pred = agg[f.bar_op];
    f.st = St::Ready;
    r.ready.push_back(i);
  }
  r.at_bar = 0;
}

std::string deadlock_text() {
  Runtime& r = rt();
  std::ostringstream o;
  o << where(nullptr) << ": deadlock: no thread can go on;";
  int shown = 0;
  for (int i = 0; i < r.nthreads && shown < 4; ++i) {
    Fiber& f = r.fibers[i];
    if (f.st == St::Bar) o << " thread " << i << " waits at __syncthreads;", ++shown;
    if (f.st == St::Warp) o << " thread " << i << " waits at " << op_name(f.op) << ";", ++shown;
    if (f.st == St::Named) o << " thread " << i << " waits at bar.sync " << f.nbar << ";", ++shown;
    if (f.st == St::MBar) {
      o << " thread " << i << " waits at mbarrier " << f.mbar << " (parity " << f.mbar_parity
        << ");";
      ++shown;
    }
  }
  int exited = 0;
  for (int i = 0; i < r.nthreads; ++i) exited += r.fibers[i].st == St::Exited;
  o << " " << exited << " of " << r.nthreads << " threads have exited";
  return o.str();
}

void run_block(uint3 b) {
  Runtime& r = rt();
  r.bidx = b;
  r.nthreads = static_cast<int>(r.block.x * r.block.y * r.block.z);
  r.live = r.nthreads;
  r.at_bar = 0;
  r.epoch = 1;
  r.wepoch.assign((r.nthreads + 31) / 32, 1);
  r.wwait.assign((r.nthreads + 31) / 32, 0);
  r.wexit.assign((r.nthreads + 31) / 32, 0);
  reset_shared();
  r.ready.clear();
  const int nwarps = (r.nthreads + 31) / 32;
  r.wg_unc.assign(static_cast<size_t>(nwarps), {});
  r.wg_groups.assign(static_cast<size_t>(nwarps), {});
  r.wg_issued.assign(static_cast<size_t>(nwarps), 0);
  r.mbars.clear();
  for (NamedBar& nb : r.nbars) nb = NamedBar{};
  for (int i = 0; i < r.nthreads; ++i) {
    Fiber& f = r.fibers[i];
    f.tid = i;
    f.warp = i / 32;
    f.lane = i % 32;
    f.st = St::Ready;
    f.op = Op::None;
    f.uncommitted.clear();
    f.groups.clear();
    f.occ.clear();
    f.stretch_loads = 0;
    f.last_valid[0] = f.last_valid[1] = false;
    f.sh_last_valid = false;
    std::fill(std::begin(f.rounds), std::end(f.rounds), 0);
    f.regs.thread_idx =
        uint3{i % r.block.x, (i / r.block.x) % r.block.y, i / (r.block.x * r.block.y)};
    f.regs.block_idx = b;
    f.regs.block_dim = r.block;
    f.regs.grid_dim = r.grid;
    f.stack = stack_for(i);
#if SIMT_ASAN
    // A fiber that exited left its last frames' redzones poisoned on this stack (it is never
    // resumed, so they are never unwound): a fresh fiber starts on clean memory.
    ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);
#endif
    f.ctx = make_fcontext(static_cast<char*>(f.stack) + kStackBytes, kStackBytes, fiber_entry);
    r.ready.push_back(i);
  }
  ++r.stats.blocks;
  r.stats.threads += static_cast<uint64_t>(r.nthreads);
  while (!r.failed) {
    if (r.ready.empty()) {
      if (r.live == 0) break;
      if (r.at_bar == r.live) {
        release_barrier();
        continue;
      }
      record_failure(cudaErrorLaunchFailure, deadlock_text());
      break;
    }
    size_t pick = 0;
    if (r.opts.schedule_seed != 0) pick = splitmix(r.rng) % r.ready.size();
    const int i = r.ready[pick];
    r.ready.erase(r.ready.begin() + static_cast<long>(pick));
    Fiber& f = r.fibers[i];
    switch_to(&f);
    if (r.failed) break;
    if (r.opts.count_traffic) end_stretch(&f);
    switch (f.st) {
      case St::Exited:
        --r.live;
        warp_event(f.warp, f.lane);  // fails if a lane waits for this one
        break;
      case St::Bar:
        ++r.at_bar;
        break;
      case St::Warp:
        warp_event(f.warp, f.lane);
        break;
      case St::Ready:
        r.ready.push_back(i);
        break;
      case St::Named:
      case St::MBar:
        break;  // woken by the barrier
    }
  }
  if (!r.failed) hopper_block_end();
  if (r.opts.count_traffic && !r.failed) end_block_traffic();
}

// kernel_fail from the scheduler context (warp_event) must not switch: it only records.
bool in_fiber() {
  return rt().cur != nullptr;
}

}  // namespace

// ---------------------------------------------------------------- public interface

Options& options() {
  return rt().opts;
}
const std::string& last_failure() {
  return rt().last_failure;
}
uint64_t failures() {
  return rt().failures;
}
Stats& stats() {
  return rt().stats;
}

void kernel_fail(const std::string& msg) {
  record_failure(cudaErrorLaunchFailure, msg);
  if (in_fiber()) yield(St::Exited);  // abandoned: the scheduler stops the launch
  throw std::runtime_error(msg);      // scheduler side (collective checks): unwound in launch
}

void launch(const void* kernel, const char* name, dim3 grid, dim3 block, size_t dyn_smem,
            const std::function<void()>& body) {
  Runtime& r = rt();
  if (r.active) {
    std::fprintf(stderr, "[simt] kernel launch from device code is not supported\n");
    std::abort();
  }
  r.failed = false;
  // cuda/launch.cuh passes its __PRETTY_FUNCTION__: keep the kernel's parameter types
  static std::string short_name;
  const std::string full(name);
  const size_t a = full.find("P = {"), b = full.find('}', a);
  short_name = a == std::string::npos || b == std::string::npos
                   ? full
                   : "kernel(" + full.substr(a + 5, b - a - 5) + ")";
  r.name = short_name.c_str();
  ++r.stats.launches;
  std::ostringstream o;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) {
    o << "launch of " << r.name << ": invalid configuration grid (" << grid.x << "," << grid.y
      << "," << grid.z << ") block (" << block.x << "," << block.y << "," << block.z << ")";
    record_failure(cudaErrorInvalidConfiguration, o.str());
    return;
  }
  auto it = r.max_dyn.find(kernel);
  const size_t optin = it == r.max_dyn.end() ? 0 : static_cast<size_t>(it->second);
  r.limit = std::max(kDefaultSmem, optin > 0 ? kMaxSmemOptin : 0);
  const size_t allowed = std::max(kDefaultSmem, optin);
  if (dyn_smem > allowed || dyn_smem > kMaxSmemOptin) {
    o << "launch of " << r.name << ": " << dyn_smem << " bytes of dynamic shared memory exceed "
      << (dyn_smem > kMaxSmemOptin ? "the sm_90 maximum of 232448"
          : optin ? "the cudaFuncSetAttribute(MaxDynamicSharedMemorySize) value of " +
                        std::to_string(optin)
                  : "49152 (48 KB) without "
                    "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    record_failure(cudaErrorInvalidValue, o.str());
    return;
  }
  if (kRedzone * 2 + dyn_smem > kSmemSpace) std::abort();
  r.grid = grid;
  r.block = block;
  r.dyn = dyn_smem;
  r.body = &body;
  r.active = true;
  r.rng = r.opts.schedule_seed * 0x2545F4914F6CDD1Dull + 1;
  // block order: row-major, or a seeded permutation (of an even sample, with max_blocks)
  const uint64_t total = uint64_t{grid.x} * grid.y * grid.z;
  const uint64_t run = r.opts.max_blocks > 0 ? std::min(total, r.opts.max_blocks) : total;
  std::vector<uint64_t> order(run);
  for (uint64_t i = 0; i < run; ++i) order[i] = run == total ? i : i * total / run;
  if (r.opts.count_traffic) {
    r.tcur = LaunchTraffic{};
    r.tcur.kernel = r.name;
    r.tcur.blocks_total = total;
    r.tcur.blocks_run = run;
    r.tcur.threads_per_block = static_cast<unsigned>(threads);
    r.tcur.grid = uint3{grid.x, grid.y, grid.z};
    r.reqs.clear();
    r.sreqs.clear();
    r.bsum = LaunchTraffic::BlockCounts{};
    r.rd_set.clear();
    r.wr_set.clear();
    std::fill(std::begin(r.math_calls), std::end(r.math_calls), 0);
    if (!r.host_lo) {  // the launching thread's stack bounds
      pthread_attr_t at;
      void* lo = nullptr;
      size_t sz = 0;
      if (pthread_getattr_np(pthread_self(), &at) == 0) {
        pthread_attr_getstack(&at, &lo, &sz);
        pthread_attr_destroy(&at);
      }
      r.host_lo = static_cast<const char*>(lo);
      r.host_hi = r.host_lo + sz;
    }
  }
  if (r.opts.schedule_seed != 0) {
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[splitmix(r.rng) % i]);
  }
  for (uint64_t lin : order) {
    const uint3 b{static_cast<unsigned>(lin % grid.x),
                  static_cast<unsigned>((lin / grid.x) % grid.y),
                  static_cast<unsigned>(lin / (uint64_t{grid.x} * grid.y))};
    try {
      run_block(b);
    } catch (const std::runtime_error&) {
      // recorded by kernel_fail
    }
    if (r.failed) break;
  }
  r.active = false;
  r.body = nullptr;
  if (r.opts.count_traffic && !r.failed) {
    r.tcur.unique_rd = r.rd_set.size();
    r.tcur.unique_wr = r.wr_set.size();
    r.tcur.calls_expf = r.math_calls[0];
    r.tcur.calls_logf = r.math_calls[1];
    r.tcur.calls_tanhf = r.math_calls[2];
    r.tcur.calls_exp2f = r.math_calls[3];
    r.tlog.push_back(r.tcur);
  }
}

std::vector<LaunchTraffic>& traffic_log() {
  return rt().tlog;
}

void count_math_call(int which) {
  Runtime& r = rt();
  if (r.opts.count_traffic && r.cur && which >= 0 && which < 4) ++r.math_calls[which];
}

void set_max_dynamic_smem(const void* kernel, int bytes) {
  rt().max_dyn[kernel] = bytes;
}

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

void syncthreads() {
  syncthreads_count(0, 0);
}
int syncthreads_count(int pred, int op) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  if (!f) std::abort();
  f->bar_pred = pred;
  f->bar_op = op;
  yield(St::Bar);
  return f->bar_pred;
}
void syncwarp(unsigned mask) {
  warp_wait(Op::SyncWarp, mask);
}
uint64_t shfl(unsigned mask, uint64_t v, int bytes, Shfl mode, int arg, int width) {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  std::memcpy(f->in, &v, 8);
  f->bytes = bytes;
  f->mode = mode;
  f->arg = arg;
  f->width = width;
  warp_wait(Op::Shfl, mask);
  uint64_t out;
  std::memcpy(&out, f->out, 8);
  return out;
}
unsigned vote(unsigned mask, bool pred, int op) {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  f->flag = pred;
  f->vop = op;
  warp_wait(Op::Vote, mask);
  unsigned out;
  std::memcpy(&out, f->out, 4);
  return out;
}
void ldmatrix(uint32_t (&reg)[4], uint32_t addr, int num, bool trans) {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  std::memcpy(f->in, &addr, 4);
  f->arg = num;
  f->flag = trans;
  warp_wait(Op::Ldm, 0xffffffffu);
  std::memcpy(reg, f->out, 16);
}
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16) {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  std::memcpy(f->in, a, 16);
  std::memcpy(f->in + 16, &b0, 4);
  std::memcpy(f->in + 20, &b1, 4);
  std::memcpy(f->in + 24, d, 16);
  f->flag = bf16;
  warp_wait(Op::Mma, 0xffffffffu);
  std::memcpy(d, f->out, 16);
}

namespace {
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
}  // namespace

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

// ---------------------------------------------------------------- Hopper (sm_90a)
//
// mbarrier: the PTX ISA's phase model. A barrier has an expected arrival count, the arrivals
// pending in the current phase, a transaction count (bytes announced by expect_tx less bytes
// delivered by complete_tx) and a phase number; the phase completes when no arrival is
// pending and the transaction count is 0, and try_wait.parity(P) succeeds once the phase of
// parity P has completed, i.e. when the current phase's parity differs from P.
// TMA: a copy marks its destination bytes "in flight" at issue (any read or write of them,
// by a thread or by a wgmma, fails the launch) and lands at the latest moment the ISA
// allows: when a thread waits on its barrier and every arrival of the phase has happened.
// wgmma: executed per warp (warp w of a warpgroup owns rows 16w..16w+15 of D, which depend
// only on its rows of A and on B), queued at issue and run at the wgmma.wait_group that
// retires its group, which reads shared memory then; the operands are also checked at issue.
// Named barriers synchronise threads but, unlike __syncthreads, are not credited by the race
// checker: a kernel passing ordinary shared-memory data through them is reported as racing
// (the Hopper kernels pass data only through TMA, wgmma and registers).

namespace {

int swizzle_mode_bytes(uint64_t desc) {
  switch (desc >> 62) {
    case 1:
      return 128;
    case 2:
      return 64;
    case 3:
      return 32;
    default:
      return 0;
  }
}

// Swizzle<B,4,3> of a shared byte address: the 16-byte chunk index (bits 4..) XOR the
// 128-byte row index (bits 7..), over log2(span / 16) bits.
uint32_t swizzle_address(uint32_t a, int span) {
  switch (span) {
    case 128:
      return a ^ ((a >> 3) & 0x70u);
    case 64:
      return a ^ ((a >> 3) & 0x30u);
    case 32:
      return a ^ ((a >> 3) & 0x10u);
    default:
      return a;
  }
}

// A shared byte an asynchronous unit reads: it must exist, be written and not be the target
// of a TMA copy in flight.
void async_read(uint32_t addr, void* dst, size_t n, const char* who) {
  Runtime& r = rt();
  for (size_t i = 0; i < n; ++i) {
    const size_t a = addr + i;
    const uint8_t st = a < kSmemSpace ? r.state[a] : 0;
    if (st == 2) continue;
    std::ostringstream o;
    o << where(r.cur) << ": " << who << " reads shared byte " << a
      << (st == 0   ? ", which belongs to no shared variable"
          : st == 1 ? ", which no thread or copy has written"
                    : ", which a TMA copy in flight will write (wait on its mbarrier first)");
    kernel_fail(o.str());
  }
  std::memcpy(dst, r.mem + addr, n);
}

double operand(uint32_t addr, bool bf16, const char* who) {
  uint16_t h;
  async_read(addr, &h, 2, who);
  return half_value(h, bf16);
}

void wgmma_check_issue(Fiber* base, int warp) {
  Runtime& r = rt();
  const int nwarps = (r.nthreads + 31) / 32;
  if (r.nthreads % 128 != 0 || (warp / 4) * 4 + 4 > nwarps) {
    kernel_fail(where(&base[0]) + ": wgmma needs the 4 warps of a warpgroup (block of " +
                std::to_string(r.nthreads) + " threads)");
  }
  const Fiber& f0 = base[0];
  if (f0.wg_n < 8 || f0.wg_n > 256 || f0.wg_n % 8 != 0) {
    kernel_fail(where(&base[0]) + ": wgmma.m64nNk16 with N = " + std::to_string(f0.wg_n) +
                " (8..256, a multiple of 8)");
  }
  for (int l = 1; l < 32; ++l) {
    const Fiber& f = base[l];
    if (f.wg_n != f0.wg_n || f.wg_rs != f0.wg_rs || f.wg_db != f0.wg_db ||
        (!f.wg_rs && f.wg_da != f0.wg_da) || f.wg_scale_d != f0.wg_scale_d ||
        f.wg_tnsp_a != f0.wg_tnsp_a || f.wg_tnsp_b != f0.wg_tnsp_b || f.flag != f0.flag) {
      kernel_fail(where(&base[l]) + ": wgmma operands differ between lanes of one warp");
    }
  }
}

// D rows 16 wig .. +16 of one warp: runs the multiply-add (products exact in FP64, summed in
// FP64 with C, rounded once to FP32, as mma.sync here).
void wgmma_run(WgOp& op, bool check_c) {
  const int n = op.n, half = n / 2;
  static thread_local std::vector<double> B;
  B.assign(static_cast<size_t>(16 * n), 0.0);
  double A[16][16];
  const char* who = "wgmma.mma_async";
  for (int m = 0; m < 16; ++m) {
    for (int k = 0; k < 16; ++k) {
      if (op.rs) {
        // A fragment: lane 4g + c holds {A[g][2c],+1}, {A[g+8][2c],+1}, {A[g][2c+8],+1},
        // {A[g+8][2c+8],+1} (as mma.m16n8k16)
        const int g = m % 8, c = (k % 8) / 2, reg = (m >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        const uint32_t v = op.a[4 * g + c][reg];
        A[m][k] = half_value(static_cast<uint16_t>(k % 2 ? v >> 16 : v & 0xffff), op.bf16);
      } else {
        A[m][k] = operand(wgmma_desc_address(op.da, op.tnsp_a != 0, 16 * op.wig + m, k), op.bf16,
                          who);
      }
    }
  }
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < n; ++j)
      B[static_cast<size_t>(k * n + j)] =
          operand(wgmma_desc_address(op.db, op.tnsp_b != 0, j, k), op.bf16, who);
  for (int l = 0; l < 32 && op.rs; ++l) {
    if (std::memcmp(op.ap[l], op.a[l], 16) != 0) {
      kernel_fail(where(nullptr) + ", lane " + std::to_string(l) +
                  ": the A registers of a wgmma in flight were changed before the "
                  "wgmma.wait_group that retires it");
    }
  }
  for (int l = 0; l < 32; ++l) {
    float* d = op.d[l];
    if (check_c && std::memcmp(d, op.c.data() + static_cast<size_t>(l * half),
                               static_cast<size_t>(half) * sizeof(float)) != 0) {
      kernel_fail(where(nullptr) + ", warp " + std::to_string(l) +
                  ": the accumulators of a wgmma in flight were changed before the "
                  "wgmma.wait_group that retires it");
    }
    const int g = l / 4, c = l % 4;
    for (int idx = 0; idx < half; ++idx) {
      const int j = idx / 4, e = idx % 4;
      const int row = g + (e >= 2 ? 8 : 0), col = 8 * j + 2 * c + (e & 1);
      double s = op.scale_d ? static_cast<double>(d[idx]) : 0.0;
      for (int k = 0; k < 16; ++k) s += A[row][k] * B[static_cast<size_t>(k * n + col)];
      d[idx] = static_cast<float>(s);
    }
  }
}

void exec_wgmma(Fiber* base, int warp) {
  Runtime& r = rt();
  wgmma_check_issue(base, warp);
  const Fiber& f0 = base[0];
  WgOp op;
  op.rs = f0.wg_rs;
  op.bf16 = f0.flag;
  op.scale_d = f0.wg_scale_d;
  op.n = f0.wg_n;
  op.tnsp_a = f0.wg_tnsp_a;
  op.tnsp_b = f0.wg_tnsp_b;
  op.wig = warp % 4;
  op.da = f0.wg_da;
  op.db = f0.wg_db;
  const int half = op.n / 2;
  op.c.resize(static_cast<size_t>(32 * half));
  for (int l = 0; l < 32; ++l) {
    op.d[l] = base[l].wg_d;
    op.ap[l] = base[l].wg_a;
    std::memcpy(op.a[l], base[l].in, 16);
    std::memcpy(op.c.data() + static_cast<size_t>(l * half), op.d[l],
                static_cast<size_t>(half) * sizeof(float));
  }
  // Chained: accumulating into the D of a wgmma still in flight (its result is the C here).
  auto writes_d = [&](const WgOp& o) { return o.d[0] == op.d[0]; };
  const auto& unc = r.wg_unc[static_cast<size_t>(warp)];
  op.chained = std::any_of(unc.begin(), unc.end(), writes_d);
  for (const auto& g : r.wg_groups[static_cast<size_t>(warp)])
    op.chained = op.chained || std::any_of(g.begin(), g.end(), writes_d);
  // The operands must be in shared memory already (a missing mbarrier wait fails here).
  const char* who = "wgmma.mma_async (at issue)";
  for (int m = 0; m < 16 && !op.rs; ++m)
    for (int k = 0; k < 16; ++k)
      (void)operand(wgmma_desc_address(op.da, op.tnsp_a != 0, 16 * op.wig + m, k), op.bf16, who);
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < op.n; ++j)
      (void)operand(wgmma_desc_address(op.db, op.tnsp_b != 0, j, k), op.bf16, who);
  r.wg_unc[static_cast<size_t>(warp)].push_back(std::move(op));
  ++r.wg_issued[static_cast<size_t>(warp)];
  if (r.opts.count_traffic) {
    r.tcur.wgmma_macs += 16ull * static_cast<uint64_t>(f0.wg_n) * 16ull;  // this warp's rows
    if (warp % 4 == 0) ++r.tcur.wgmma_insts;
  }
}

// wgmma.wait_group keep: the warp's committed groups run, oldest first, until `keep` remain.
void wgmma_retire(int warp, int keep) {
  Runtime& r = rt();
  auto& groups = r.wg_groups[static_cast<size_t>(warp)];
  while (static_cast<int>(groups.size()) > keep) {
    std::vector<WgOp> g = std::move(groups.front());
    groups.pop_front();
    for (WgOp& op : g) wgmma_run(op, !op.chained);
  }
}

void hopper_block_end() {
  Runtime& r = rt();
  for (size_t w = 0; w < r.wg_unc.size(); ++w) {
    if (!r.wg_unc[w].empty() || !r.wg_groups[w].empty()) {
      record_failure(cudaErrorLaunchFailure,
                     where(nullptr) + ": warp " + std::to_string(w) +
                         " exited with wgmma operations not retired by wgmma.wait_group");
      return;
    }
  }
  for (size_t w = 0; w + 3 < r.wg_issued.size(); w += 4) {
    for (size_t i = 1; i < 4; ++i) {
      if (r.wg_issued[w + i] != r.wg_issued[w]) {
        record_failure(cudaErrorLaunchFailure,
                       where(nullptr) + ": the warps of warpgroup " + std::to_string(w / 4) +
                           " issued different numbers of wgmma (" +
                           std::to_string(r.wg_issued[w]) + " and " +
                           std::to_string(r.wg_issued[w + i]) + "): wgmma is .aligned");
        return;
      }
    }
  }
  for (auto& [addr, b] : r.mbars) {
    if (!b.copies.empty()) {
      record_failure(cudaErrorLaunchFailure,
                     where(nullptr) + ": TMA copies completing on mbarrier " +
                         std::to_string(addr) + " were never waited for");
      return;
    }
  }
}

MBar& mbar_at(uint32_t addr) {
  Runtime& r = rt();
  auto it = r.mbars.find(addr);
  if (it == r.mbars.end()) {
    kernel_fail(where(r.cur) + ": mbarrier at shared address " + std::to_string(addr) +
                " used before mbarrier.init");
  }
  return it->second;
}

void tma_land(const TmaCopy& c) {
  Runtime& r = rt();
  const TensorMap& m = c.map;
  const int eb = m.elem_bytes;
  uint32_t lin = 0;
  for (uint32_t z = 0; z < m.box[2]; ++z)
    for (uint32_t y = 0; y < m.box[1]; ++y)
      for (uint32_t x = 0; x < m.box[0]; ++x, lin += static_cast<uint32_t>(eb)) {
        const int64_t g[3] = {c.coords[0] + static_cast<int64_t>(x),
                              c.coords[1] + static_cast<int64_t>(y),
                              c.coords[2] + static_cast<int64_t>(z)};
        bool in = true;
        for (int d = 0; d < 3; ++d) in = in && g[d] >= 0 && g[d] < static_cast<int64_t>(m.dims[d]);
        const uint32_t a = swizzle_address(c.dst + lin, m.swizzle);
        if (in) {
          const char* src = static_cast<const char*>(m.base) + g[0] * eb +
                            g[1] * static_cast<int64_t>(m.strides[1]) +
                            g[2] * static_cast<int64_t>(m.strides[2]);
          std::memcpy(r.mem + a, src, static_cast<size_t>(eb));
        } else {
          std::memset(r.mem + a, 0, static_cast<size_t>(eb));  // OOB fill: zeros
        }
        for (int i = 0; i < eb; ++i) r.state[a + static_cast<uint32_t>(i)] = 2;
      }
}

uint32_t box_bytes(const TensorMap& m) {
  return m.box[0] * m.box[1] * m.box[2] * static_cast<uint32_t>(m.elem_bytes);
}

// The phase completes if it can; copies land first when someone waits (`waiting`).
void mbar_progress(uint32_t addr, MBar& b, bool waiting) {
  Runtime& r = rt();
  if (b.pending != 0) return;
  if (waiting || !b.waiters.empty()) {
    for (const TmaCopy& c : b.copies) {
      tma_land(c);
      b.tx -= box_bytes(c.map);
    }
    b.copies.clear();
  }
  if (!b.copies.empty() || b.tx > 0) return;
  if (b.tx < 0) {
    kernel_fail(where(r.cur) + ": mbarrier " + std::to_string(addr) +
                ": TMA copies delivered more bytes than expect_tx announced");
  }
  ++b.phase;
  b.pending = b.expected;
  const uint32_t parity = b.phase & 1u;
  std::vector<int> still;
  for (int i : b.waiters) {
    Fiber& f = r.fibers[static_cast<size_t>(i)];
    if (f.mbar_parity != parity) {
      f.st = St::Ready;
      r.ready.push_back(i);
    } else {
      still.push_back(i);
    }
  }
  b.waiters.swap(still);
}

}  // namespace

uint32_t wgmma_desc_address(uint64_t desc, bool mn_major, int mn, int k) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3fff) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3fff) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3fff) << 4;
  const int span = swizzle_mode_bytes(desc);
  if ((desc >> 49) & 7) kernel_fail("wgmma descriptor: a base offset other than 0 is not emulated");
  const uint32_t m = static_cast<uint32_t>(mn), kk = static_cast<uint32_t>(k);
  uint32_t a;
  if (!mn_major) {
    // K-major: core matrices of 8 rows (M/N) x 16 bytes (8 elements of K)
    if (span == 0) {
      a = start + (m % 8) * 16 + (m / 8) * sbo + (kk / 8) * lbo + (kk % 8) * 2;
    } else {  // rows of `span` bytes, 8 rows an atom; K = 16 lies within one row
      a = start + (m % 8) * static_cast<uint32_t>(span) + (m / 8) * sbo + kk * 2;
    }
  } else {
    // MN-major: rows are K indices, elements contiguous along M/N
    if (span == 0) {
      a = start + (m % 8) * 2 + (m / 8) * sbo + (kk % 8) * 16 + (kk / 8) * lbo;
    } else {
      const uint32_t w = static_cast<uint32_t>(span) / 16;  // 16-byte chunks in a row
      a = start + (m % 8) * 2 + ((m / 8) % w) * 16 + (m / (8 * w)) * lbo +
          (kk % 8) * static_cast<uint32_t>(span) + (kk / 8) * sbo;
    }
  }
  return swizzle_address(a, span);
}

TensorMap make_tensor_map(const void* base, int rank, int elem_bytes, const uint64_t* dims,
                          const uint64_t* strides_bytes, const uint32_t* box, int swizzle) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("make_tensor_map: " + m); };
  if (rank < 1 || rank > 3) bad("rank " + std::to_string(rank) + " (1..3 emulated)");
  if (elem_bytes != 2) bad("only 16-bit elements are emulated");
  if (reinterpret_cast<uintptr_t>(base) % 16) bad("global address not 16-byte aligned");
  if (swizzle != 0 && swizzle != 32 && swizzle != 64 && swizzle != 128) bad("swizzle");
  TensorMap m;
  m.magic = TensorMap::kMagic;
  m.base = base;
  m.rank = rank;
  m.elem_bytes = elem_bytes;
  m.strides[0] = static_cast<uint64_t>(elem_bytes);
  for (int d = 0; d < rank; ++d) {
    if (dims[d] == 0 || dims[d] > (1ull << 32)) bad("dimension " + std::to_string(d));
    if (box[d] == 0 || box[d] > 256) bad("box dimension " + std::to_string(d) + " (1..256)");
    m.dims[d] = dims[d];
    m.box[d] = box[d];
    if (d > 0) {
      if (strides_bytes[d - 1] % 16 || strides_bytes[d - 1] >= (1ull << 40))
        bad("stride of dimension " + std::to_string(d) + " (a multiple of 16 bytes)");
      m.strides[d] = strides_bytes[d - 1];
    }
  }
  const uint32_t inner = box[0] * static_cast<uint32_t>(elem_bytes);
  if (inner % 16) bad("the box's inner extent is not a multiple of 16 bytes");
  if (swizzle != 0 && inner != static_cast<uint32_t>(swizzle)) {
    // the hardware allows inner <= span; the emulator implements the layout the kernels use
    bad("inner box extent " + std::to_string(inner) + " bytes with a " + std::to_string(swizzle) +
        "-byte swizzle (the emulator implements inner extent == swizzle span only)");
  }
  m.swizzle = swizzle;
  return m;
}

void mbar_init(uint32_t addr, uint32_t count) {
  Runtime& r = rt();
  if (!r.cur) std::abort();
  if (addr % 8 || addr + 8 > kSmemSpace || r.state[addr] == 0 || r.state[addr + 7] == 0)
    kernel_fail(where(r.cur) + ": mbarrier.init at " + std::to_string(addr) +
                ": not an 8-byte-aligned shared variable");
  if (count == 0 || count >= (1u << 20))
    kernel_fail(where(r.cur) + ": mbarrier.init count " + std::to_string(count));
  MBar b;
  b.expected = b.pending = count;
  r.mbars[addr] = std::move(b);
  for (uint32_t i = 0; i < 8; ++i) r.state[addr + i] = 2;
}

void mbar_arrive(uint32_t addr) {
  Runtime& r = rt();
  MBar& b = mbar_at(addr);
  if (b.pending == 0) {
    kernel_fail(where(r.cur) + ": mbarrier.arrive on " + std::to_string(addr) +
                " with no arrival pending in the current phase (more arrivals than its count)");
  }
  --b.pending;
  mbar_progress(addr, b, false);
}

void mbar_arrive_expect_tx(uint32_t addr, uint32_t bytes) {
  MBar& b = mbar_at(addr);
  b.tx += bytes;
  mbar_arrive(addr);
}

void mbar_wait(uint32_t addr, uint32_t parity) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  if (!f) std::abort();
  MBar& b = mbar_at(addr);
  mbar_progress(addr, b, true);
  if ((b.phase & 1u) != (parity & 1u)) return;
  f->mbar = addr;
  f->mbar_parity = parity & 1u;
  b.waiters.push_back(f->tid);
  yield(St::MBar);
}

void tma_load(uint32_t dst, const TensorMap* map, const int* coords, uint32_t mbar) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  if (!f) std::abort();
  if (!map || map->magic != TensorMap::kMagic)
    kernel_fail(where(f) + ": cp.async.bulk.tensor with a tensor map not made by make_tensor_map");
  const uint32_t align = map->swizzle ? 8u * static_cast<uint32_t>(map->swizzle) : 128u;
  if (dst % align)
    kernel_fail(where(f) + ": cp.async.bulk.tensor destination " + std::to_string(dst) +
                " not aligned to " + std::to_string(align) + " bytes");
  MBar& b = mbar_at(mbar);
  TmaCopy c;
  c.dst = dst;
  c.map = *map;
  for (int d = 0; d < map->rank; ++d) c.coords[d] = coords[d];
  const uint32_t n = box_bytes(*map);
  if (dst + n > kSmemSpace) kernel_fail(where(f) + ": cp.async.bulk.tensor beyond shared memory");
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t& st = r.state[dst + i];
    if (st == 0 || st == 3) {
      kernel_fail(where(f) + ": cp.async.bulk.tensor to shared byte " + std::to_string(dst + i) +
                  (st == 0 ? ", which belongs to no shared variable"
                           : ", which another TMA copy in flight writes"));
    }
    st = 3;
  }
  if (r.opts.count_traffic) {
    r.tcur.tma_bytes += n;
    const TensorMap& m = *map;
    for (uint32_t z = 0; z < m.box[2]; ++z)
      for (uint32_t y = 0; y < m.box[1]; ++y) {
        const int64_t gy = c.coords[1] + static_cast<int64_t>(y),
                      gz = c.coords[2] + static_cast<int64_t>(z);
        const int64_t x0 = std::max<int64_t>(c.coords[0], 0),
                      x1 = std::min<int64_t>(c.coords[0] + m.box[0], static_cast<int64_t>(m.dims[0]));
        if (gy < 0 || gz < 0 || gy >= static_cast<int64_t>(m.dims[1]) ||
            gz >= static_cast<int64_t>(m.dims[2]) || x1 <= x0)
          continue;
        const char* src = static_cast<const char*>(m.base) + x0 * m.elem_bytes +
                          gy * static_cast<int64_t>(m.strides[1]) +
                          gz * static_cast<int64_t>(m.strides[2]);
        record_global(src, static_cast<size_t>((x1 - x0) * m.elem_bytes), false,
                      reinterpret_cast<uintptr_t>(&tma_load) + y + 1024 * z, false);
      }
  }
  b.copies.push_back(c);
  mbar_progress(mbar, b, false);
}

void wgmma(float* d, int n, const uint32_t* a_regs, uint64_t da, uint64_t db, bool scale_d,
           int tnsp_a, int tnsp_b, bool bf16) {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  f->wg_d = d;
  f->wg_n = n;
  f->wg_rs = a_regs != nullptr;
  f->wg_a = a_regs;
  if (a_regs) std::memcpy(f->in, a_regs, 16);
  f->wg_da = da;
  f->wg_db = db;
  f->wg_scale_d = scale_d;
  f->wg_tnsp_a = tnsp_a;
  f->wg_tnsp_b = tnsp_b;
  f->flag = bf16;
  warp_wait(Op::Wgmma, 0xffffffffu);
}
void wgmma_commit() {
  warp_wait(Op::WgCommit, 0xffffffffu);
}
void wgmma_wait(int n) {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  f->arg = n;
  warp_wait(Op::WgWait, 0xffffffffu);
}

void named_barrier(int id, int count, bool wait) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  if (!f) std::abort();
  if (id < 1 || id > 15)
    kernel_fail(where(f) + ": bar.sync/arrive id " + std::to_string(id) +
                " (1..15; 0 is __syncthreads')");
  if (count <= 0 || count % 32 || count > r.nthreads)
    kernel_fail(where(f) + ": bar.sync/arrive count " + std::to_string(count) +
                " (a multiple of 32, at most the block's " + std::to_string(r.nthreads) + ")");
  NamedBar& nb = r.nbars[id];
  if (nb.arrived > 0 && nb.count != count)
    kernel_fail(where(f) + ": bar " + std::to_string(id) + " with counts " +
                std::to_string(nb.count) + " and " + std::to_string(count));
  nb.count = count;
  ++nb.arrived;
  if (nb.arrived == count) {
    for (int i : nb.waiting) {
      r.fibers[static_cast<size_t>(i)].st = St::Ready;
      r.ready.push_back(i);
    }
    nb.waiting.clear();
    nb.arrived = 0;
    return;
  }
  if (!wait) return;
  f->nbar = id;
  nb.waiting.push_back(f->tid);
  yield(St::Named);
}

void setmaxnreg(int regs) {
  Fiber* f = rt().cur;
  if (!f) std::abort();
  if (regs < 24 || regs > 256 || regs % 8)
    kernel_fail(where(f) + ": setmaxnreg " + std::to_string(regs) + " (24..256, a multiple of 8)");
}

// Memory-access hooks for the kernel code (see the top of this file).
// ---------------------------------------------------------------- traffic

namespace {

// A global access of the running thread. Accesses to the thread's own stack (locals whose
// address the compiler keeps in memory), to the launching thread's stack (the kernel's
// argument tuple) and to the emulator's thread registers are not device memory.
void record_global(const void* p, size_t n, bool write, uintptr_t pc, bool blocking) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  const char* c = static_cast<const char*>(p);
  const char* st = static_cast<const char*>(f->stack);
  if (c >= st && c < st + kStackBytes) return;
  if (c >= r.host_lo && c < r.host_hi) return;
  const char* fb = reinterpret_cast<const char*>(r.fibers.data());
  if (c >= fb && c < fb + r.fibers.size() * sizeof(Fiber)) return;
  if (c >= reinterpret_cast<const char*>(&g_regs) &&
      c < reinterpret_cast<const char*>(&g_regs + 1))
    return;
  if (n == 0) return;
  const uint64_t a = reinterpret_cast<uintptr_t>(p);
  // The host compiler copies a 16-byte vector (one LDG.128 / STG.128 on the GPU) element by
  // element: an access that continues the thread's previous one of the same kind inside the
  // same aligned 16 bytes is that instruction's next part, not a new request. (A 16-byte
  // aligned chunk never crosses a sector, so the sector is recorded already.)
  const int w = write ? 1 : 0;
  if (f->last_valid[w] && a == f->last_end[w] && (a >> 4) == ((a + n - 1) >> 4) &&
      ((a - 1) >> 4) == (a >> 4)) {
    f->last_end[w] = a + n;
    (write ? r.tcur.bytes_wr : r.tcur.bytes_rd) += n;
    return;
  }
  f->last_valid[w] = true;
  f->last_end[w] = a + n;
  const uint32_t occ = f->occ[pc]++;
  std::vector<uint64_t>& sec = r.reqs[ReqKey{pc, occ, f->warp, write}];
  bool cold = false;  // a sector this block has not read before: a trip to L2 or DRAM
  for (uint64_t s = a >> 5; s <= (a + n - 1) >> 5; ++s) {
    sec.push_back(s);
    // a read of a sector this launch wrote is served from the cache the write went through
    if (write) {
      r.wr_set.insert(s);
    } else if (!r.wr_set.count(s)) {
      r.rd_set.insert(s);
    }
    if (!write) cold |= r.blk_rd.insert(s).second;
  }
  if (write) {
    r.tcur.bytes_wr += n;
  } else {
    r.tcur.bytes_rd += n;
    // L1 hits (sectors the block read already) do not add a round of DRAM latency
    if (blocking && cold) ++f->stretch_loads;
  }
}

// The running stretch of thread f ended (it reached a switch point or exited).
void end_stretch(Fiber* f) {
  f->last_valid[0] = f->last_valid[1] = false;
  f->sh_last_valid = false;
  const uint64_t l = f->stretch_loads;
  if (l == 0) return;
  for (int k = 0; k < LaunchTraffic::kRoundWidths; ++k) f->rounds[k] += (l + (1u << k) - 1) >> k;
  f->stretch_loads = 0;
}

// Fold one finished block into the launch's counts.
void end_block_traffic() {
  Runtime& r = rt();
  for (auto& [key, sec] : r.reqs) {
    std::sort(sec.begin(), sec.end());
    const uint64_t k = static_cast<uint64_t>(std::unique(sec.begin(), sec.end()) - sec.begin());
    if (key.write) {
      ++r.tcur.requests_wr;
      r.tcur.sectors_wr += k;
    } else {
      ++r.tcur.requests_rd;
      r.tcur.sectors_rd += k;
    }
  }
  r.reqs.clear();
  r.blk_rd.clear();
  end_block_compute();
  for (int i = 0; i < r.nthreads; ++i) {
    Fiber& f = r.fibers[i];
    end_stretch(&f);
    for (int k = 0; k < LaunchTraffic::kRoundWidths; ++k)
      r.tcur.rounds[k] = std::max(r.tcur.rounds[k], f.rounds[k]);
  }
  r.tcur.smem_bytes = r.dyn + r.static_bytes;
}

// ---------------------------------------------------------------- compute-side counts
// (issue 43; the cost model's compute terms, tests/simt/cost/). Shared memory has 32 banks
// of 4 bytes; one wavefront serves at most one 4-byte word per bank, so a warp request costs
// the largest number of distinct words it touches in any one bank (a word read by several
// lanes is a broadcast: one).

uint64_t wavefronts_of(std::vector<uint32_t>& words) {
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  uint32_t per_bank[32] = {};
  uint32_t most = 0;
  for (uint32_t w : words) most = std::max(most, ++per_bank[w % 32]);
  return most;
}

// A generic shared access (offset off in the block's shared space) of the running thread:
// grouped into warp requests by instruction, n-th execution and warp, as record_global; a
// 16-byte vector copied element by element is one request (one LDS.128 / STS.128).
void record_shared(size_t off, size_t n, bool write, uintptr_t pc) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  if (n == 0) return;
  const uint64_t a = off;
  if (f->sh_last_valid && f->sh_last_write == write && a == f->sh_last_end &&
      (a >> 4) == ((a + n - 1) >> 4) && ((a - 1) >> 4) == (a >> 4)) {
    f->sh_last_end = a + n;
    std::vector<uint32_t>& w =
        r.sreqs[ReqKey{f->sh_last_pc, f->sh_last_occ, f->warp, write}];
    for (uint64_t x = a >> 2; x <= (a + n - 1) >> 2; ++x) w.push_back(static_cast<uint32_t>(x));
    return;
  }
  const uint32_t occ = f->occ[pc]++;
  f->sh_last_valid = true;
  f->sh_last_write = write;
  f->sh_last_end = a + n;
  f->sh_last_pc = pc;
  f->sh_last_occ = occ;
  std::vector<uint32_t>& w = r.sreqs[ReqKey{pc, occ, f->warp, write}];
  for (uint64_t x = a >> 2; x <= (a + n - 1) >> 2; ++x) w.push_back(static_cast<uint32_t>(x));
}

// A warp collective completes (every lane has arrived): mma.sync and ldmatrix are counted
// once per warp; ldmatrix's matrix i is read by lanes 8i..8i+7, one 16-byte row each, and
// each matrix is its own phase (wavefronts summed over the matrices).
void count_collective(Op op, Fiber* base) {
  Runtime& r = rt();
  if (op == Op::Mma) {
    ++r.tcur.mma_sync;
  } else if (op == Op::Ldm) {
    ++r.tcur.ldsm_insts;
    const int num = base[0].arg;
    std::vector<uint32_t> words;
    for (int i = 0; i < num && i < 4; ++i) {
      words.clear();
      for (int rr = 0; rr < 8; ++rr) {
        uint32_t addr;
        std::memcpy(&addr, base[8 * i + rr].in, 4);
        for (uint32_t k = 0; k < 4; ++k) words.push_back(addr / 4 + k);
      }
      r.tcur.ldsm_wavefronts += wavefronts_of(words);
    }
  }
}

// Fold the finished block's generic shared requests into the launch's counts.
void end_block_compute() {
  Runtime& r = rt();
  for (auto& [key, words] : r.sreqs) {
    ++r.tcur.smem_requests;
    r.tcur.smem_wavefronts += wavefronts_of(words);
  }
  r.sreqs.clear();
  // this block's share: the counters now less their values at the previous block's end
  LaunchTraffic::BlockCounts b{r.bidx, r.tcur.mma_sync, r.tcur.wgmma_macs,
                               r.tcur.ldsm_wavefronts, r.tcur.smem_wavefronts,
                               r.tcur.barriers, r.math_calls[3], r.tcur.tma_bytes};
  const LaunchTraffic::BlockCounts o = r.bsum;
  r.bsum = b;
  b.mma_sync -= o.mma_sync, b.wgmma_macs -= o.wgmma_macs;
  b.ldsm_wavefronts -= o.ldsm_wavefronts, b.smem_wavefronts -= o.smem_wavefronts;
  b.barriers -= o.barriers, b.calls_exp2f -= o.calls_exp2f, b.tma_bytes -= o.tma_bytes;
  r.tcur.blocks.push_back(b);
}

}  // namespace

void on_access(const void* p, size_t n, bool write, uintptr_t pc) {
  Runtime& r = rt();
  if (!r.cur || r.failed) return;
  const size_t off = offset_of(p);
  if (off >= kSmemSpace) {  // not shared memory
    if (r.opts.count_traffic) record_global(p, n, write, pc, true);
    return;
  }
  check_access(r.cur, off, n, write);
  if (r.failed) kernel_fail(r.last_failure);
  if (r.opts.count_traffic) record_shared(off, n, write, pc);
}

// ---------------------------------------------------------------- formats

float double_to_float(double x, int mode) {
  const float f = static_cast<float>(x);  // round to nearest even
  if (mode == 0 || std::isnan(x) || static_cast<double>(f) == x) return f;
  if (std::isinf(f)) {  // finite x beyond FLT_MAX
    const bool pos = x > 0;
    if (mode == 1) return pos ? FLT_MAX : -FLT_MAX;
    if (mode == 2) return pos ? f : -FLT_MAX;
    return pos ? FLT_MAX : f;
  }
  const bool above = static_cast<double>(f) > x;
  if (mode == 1) {  // toward zero
    if (x > 0 && above) return std::nextafter(f, 0.0f);
    if (x < 0 && !above) return std::nextafter(f, 0.0f);
    return f;
  }
  if (mode == 2) return above ? f : std::nextafter(f, INFINITY);
  return above ? std::nextafter(f, -INFINITY) : f;
}

uint16_t f32_to_bf16_rn(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN: CUDA's canonical bf16 NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t f32_to_f16_rn(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fff;           // NaN: CUDA's canonical fp16 NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (and Inf) -> Inf
  if (a >= 0x38800000u) {                       // normal fp16 (>= 2^-14)
    const uint32_t mant = a & 0x7fffffu;
    const uint32_t e = (a >> 23) - 127 + 15;
    uint32_t h = (e << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: rounds to (signed) zero
  const uint64_t m = (a & 0x7fffffu) | 0x800000u;
  const int s = 126 - static_cast<int>(a >> 23);  // value / 2^-24 = m >> s
  uint64_t h = m >> s;
  const uint64_t rem = m & ((uint64_t{1} << s) - 1), half = uint64_t{1} << (s - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;  // exact
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e - 15 + 127) << 23) | (m << 13));
}

}  // namespace simt

// ---------------------------------------------------------------- cuda runtime (host)

cudaError_t cudaGetLastError() {
  auto& r = simt::rt();
  const cudaError_t e = r.last_error;
  if (e != cudaSuccess) r.err_text = r.last_failure;
  r.last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  return simt::rt().last_error;
}
const char* cudaGetErrorString(cudaError_t e) {
  auto& r = simt::rt();
  if (e != cudaSuccess && !r.err_text.empty()) return r.err_text.c_str();
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    default:
      return "simt emulator error";
  }
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaError(simt)";
  }
}

// ---------------------------------------------------------------- instrumentation hooks
// GCC's -fsanitize=thread calls these around every memory access of the kernel sources.
extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
#define SIMT_PC reinterpret_cast<uintptr_t>(__builtin_return_address(0))
#define SIMT_HOOK(n)                                 \
  void __tsan_read##n(void* p) {                     \
    simt::on_access(p, n, false, SIMT_PC);           \
  }                                                  \
  void __tsan_write##n(void* p) {                    \
    simt::on_access(p, n, true, SIMT_PC);            \
  }                                                  \
  void __tsan_unaligned_read##n(void* p) {           \
    simt::on_access(p, n, false, SIMT_PC);           \
  }                                                  \
  void __tsan_unaligned_write##n(void* p) {          \
    simt::on_access(p, n, true, SIMT_PC);            \
  }                                                  \
  void __tsan_volatile_read##n(void* p) {            \
    simt::on_access(p, n, false, SIMT_PC);           \
  }                                                  \
  void __tsan_volatile_write##n(void* p) {           \
    simt::on_access(p, n, true, SIMT_PC);            \
  }
SIMT_HOOK(1)
SIMT_HOOK(2)
SIMT_HOOK(4)
SIMT_HOOK(8)
SIMT_HOOK(16)
#undef SIMT_HOOK
void __tsan_read_range(void* p, unsigned long n) {
  simt::on_access(p, n, false, SIMT_PC);
}
void __tsan_write_range(void* p, unsigned long n) {
  simt::on_access(p, n, true, SIMT_PC);
}
#undef SIMT_PC
}
