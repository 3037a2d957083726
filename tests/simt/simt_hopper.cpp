// The SIMT emulator's Hopper (sm_90a) units (simt.h, "Hopper"): mbarriers with their phases
// and transaction counts, TMA tensor copies (in flight until a thread waits on their
// barrier), wgmma (queued per warp at issue, run at the wgmma.wait_group that retires its
// group), the wgmma matrix descriptors' addressing with the swizzles, named barriers and
// setmaxnreg. The model and its checks are described below.
#include "simt/simt_internal.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace simt {

using namespace detail;

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

}  // namespace

namespace detail {

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

}  // namespace detail

namespace {

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

}  // namespace simt
