// The SIMT emulator's warp collectives (simt.h, "barriers and warp collectives"): __syncwarp,
// __shfl_*_sync, __ballot/__any/__all_sync, ldmatrix and mma.sync (the Hopper ones,
// wgmma.*, arrive here too and run in simt_hopper.cpp). A lane that reaches one waits until
// every lane its mask names has arrived at the same collective with the same mask; the last
// arrival runs it for the warp (warp_event), which also fails a launch whose lanes disagree
// or wait for a lane that has exited.
#include "simt/simt_internal.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace simt {

using namespace detail;

namespace detail {

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

double half_value(uint16_t h, bool bf16) {
  if (bf16) return static_cast<double>(__uint_as_float(static_cast<uint32_t>(h) << 16));
  return static_cast<double>(f16_to_f32(h));
}

}  // namespace detail

namespace {

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

void mismatch(const Fiber& o, int l, const Fiber& f) {
  kernel_fail(where(&o) + ": lane arrives at " + op_name(o.op) + " (mask " +
              std::to_string(o.mask) + ") while lane " + std::to_string(l) + " waits at " +
              op_name(f.op) + " (mask " + std::to_string(f.mask) + ")");
}

uint32_t bit(int lane) {
  return 1u << lane;
}

}  // namespace

namespace detail {

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

}  // namespace detail

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

}  // namespace simt
