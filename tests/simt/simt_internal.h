// The SIMT emulator runtime's own state, private to its source files (simt.cpp,
// simt_shared.cpp, simt_warp.cpp, simt_hopper.cpp, simt_counts.cpp; the kernels and the tests
// see simt.h only): the fibers (one per CUDA thread), the block's shared memory and race
// records, the Hopper units' queues, the traffic counters, the one Runtime that holds them,
// and the functions the runtime's files call across one another (in simt::detail).
#pragma once
#include "simt/simt.h"

#include <boost/context/detail/fcontext.hpp>
#include <deque>
#include <map>
#include <string>
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

namespace simt::detail {

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

const char* op_name(Op op);  // the collective's name in failures (simt_warp.cpp)

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

inline Runtime& rt() {
  static Runtime* r = new Runtime;  // never destroyed: hooks may run during exit
  return *r;
}

// ---- called across the runtime's files (the file that defines each)
// simt.cpp: failures, and the running fiber's switch back to the scheduler
std::string where(const Fiber* f);
void record_failure(cudaError_t code, const std::string& msg);
void yield(St s);
// simt_shared.cpp
void check_access(const Fiber* f, size_t off, size_t n, bool write);
size_t offset_of(const void* p);
void reset_shared();
void complete_group(Fiber* f, const std::vector<Copy>& g);
// simt_warp.cpp
void warp_event(int warp, int a);
void warp_wait(Op op, unsigned mask);
double half_value(uint16_t h, bool bf16);
// simt_hopper.cpp
void exec_wgmma(Fiber* base, int warp);
void wgmma_retire(int warp, int keep);
void hopper_block_end();
// simt_counts.cpp
void end_stretch(Fiber* f);
void end_block_traffic();
void record_global(const void* p, size_t n, bool write, uintptr_t pc, bool blocking);
void record_shared(size_t off, size_t n, bool write, uintptr_t pc);
void count_collective(Op op, Fiber* base);

}  // namespace simt::detail
