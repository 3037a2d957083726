// The SIMT emulator's counts for the cost model (tests/simt/cost/; simt.h, "global-memory
// traffic", with Options::count_traffic): the global accesses grouped into warp requests and
// 32-byte sectors, the dependent rounds of loads of each thread, and the compute side
// (mma.sync, ldmatrix and shared-memory wavefronts, barriers), folded into the launch's
// LaunchTraffic at each block's end and split per block.
#include "simt/simt_internal.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace simt {

using namespace detail;

namespace detail {

void end_block_compute();

// ---------------------------------------------------------------- traffic

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

}  // namespace detail

std::vector<LaunchTraffic>& traffic_log() {
  return rt().tlog;
}

void count_math_call(int which) {
  Runtime& r = rt();
  if (r.opts.count_traffic && r.cur && which >= 0 && which < 4) ++r.math_calls[which];
}

}  // namespace simt
