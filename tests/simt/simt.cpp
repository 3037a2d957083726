// SIMT emulator runtime (see simt.h for the model): the launch and its scheduler (the blocks
// one after another, each CUDA thread a fiber that runs until a barrier, a collective or its
// exit), the settings, failures and statistics of the public interface, the CUDA runtime's
// host calls, and the memory-access hooks. Compiled WITHOUT -fsanitize=thread: it
// implements the __tsan_* hooks that the instrumented kernel sources call on every memory
// access, and checks the ones that land in the running block's shared memory.
// The rest of the runtime: simt_shared.cpp (shared memory and its checks, cp.async),
// simt_warp.cpp (warp collectives, mma.sync), simt_hopper.cpp (mbarrier, TMA, wgmma),
// simt_counts.cpp (traffic and compute counts for the cost model), simt_formats.cpp (float
// conversions); their shared state: simt_internal.h.
#include "simt/simt_internal.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace simt {

ThreadRegs* g_regs = nullptr;

using namespace detail;

namespace detail {

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

}  // namespace detail

namespace {

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

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
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

void set_max_dynamic_smem(const void* kernel, int bytes) {
  rt().max_dyn[kernel] = bytes;
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

// Memory-access hooks for the kernel code (see the top of this file).
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
