// Communicators for data-parallel training (docs/distributed.md): all-reduce, reduce-scatter,
// all-gather, broadcast and barrier over the ranks of one job. Three implementations:
//   single  one process, every operation a no-op (world 1)
//   mpi     host buffers over MPI (CPU data parallelism; built when CMake finds MPI)
//   nccl    device buffers over NCCL (GPU; built with the CUDA backend when nccl.h is found),
//           the NCCL unique id exchanged through MPI, a shared file or a TCP rendezvous
//
// Reduction order. The MPI communicator sums in a fixed order that does not depend on the
// transport: the owner of each part receives every rank's copy of it and adds them in rank
// order, acc = x_0; acc = round_fmt(acc + x_1); ...; acc = round_fmt(acc + x_{W-1}), FP32 adds
// (FP64 for FP64 storage) rounded to the logical format after each add -- the arithmetic of
// the model's separate gradient accumulation (train.grad_accum_mode), so W ranks with one
// micro-batch each give the bits of one process accumulating the same W micro-batches. NCCL
// uses its own (ring / tree) order.
//
// Timeouts. Every operation of the mpi and nccl communicators completes within timeout_s or
// ends the whole job with a message naming the operation (a rank died, hangs or is stuck
// elsewhere); see abort().
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace st {

// Where a launcher placed this process, from its environment: mpirun (OMPI_COMM_WORLD_RANK,
// _SIZE, _LOCAL_RANK), Slurm srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or
// torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK). Without any: rank 0 of 1.
struct LaunchInfo {
  int rank = 0, world = 1, local_rank = 0;
  std::string launcher = "none";  // "mpirun", "slurm", "env" or "none"
};
LaunchInfo launch_info();

// Contiguous parts of a flat array of n elements, one per rank: part r is [begin(r), end(r)).
// The (n, world, align) form gives every rank ceil(n / world) elements rounded up to a
// multiple of align, the last ranks what is left (possibly nothing).
class Partition {
 public:
  Partition() = default;
  Partition(int64_t n, int world, int64_t align = 1);
  explicit Partition(std::vector<int64_t> offsets);  // world + 1 nondecreasing offsets from 0
  int world() const { return static_cast<int>(off_.size()) - 1; }
  int64_t size() const { return off_.back(); }
  int64_t begin(int r) const { return off_.at(r); }
  int64_t end(int r) const { return off_.at(r + 1); }
  int64_t count(int r) const { return end(r) - begin(r); }
  int64_t max_count() const;
  const std::vector<int64_t>& offsets() const { return off_; }

 private:
  std::vector<int64_t> off_{0, 0};
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "single", "mpi", "nccl"
  int rank() const { return rank_; }
  int world() const { return world_; }
  int local_rank() const { return local_rank_; }
  // true: the buffer arguments of reduce_scatter / all_gather / all_reduce are device
  // pointers (NCCL); false: host memory.
  virtual bool device_buffers() const { return false; }

  // buf holds p.size() elements of `storage` on every rank. On return, part p.begin(rank) ..
  // p.end(rank) of this rank's buf holds the sum over ranks of that part (rank order, fmt
  // rounding after each add; see the top of this file); the rest of buf is unspecified.
  // `what` names the operation in errors ("gradients of step 12").
  virtual void reduce_scatter(void* buf, const Partition& p, DType storage, DType fmt,
                              const std::string& what) = 0;
  // Every rank's part of buf to every rank (no arithmetic).
  virtual void all_gather(void* buf, const Partition& p, DType storage,
                          const std::string& what) = 0;
  // reduce_scatter over Partition(n, world) then all_gather: every rank ends with the same
  // bits.
  virtual void all_reduce(void* buf, int64_t n, DType storage, DType fmt,
                          const std::string& what);
  virtual void broadcast(void* buf, size_t bytes, int root, const std::string& what) = 0;
  virtual void barrier(const std::string& what) = 0;

  // Host memory, whatever device_buffers() says (the NCCL communicator stages them).
  // Sum of n doubles over ranks, the same bits on every rank.
  virtual void all_reduce_host(double* x, int64_t n, const std::string& what);
  virtual void all_gather_host(double* x, const Partition& p, const std::string& what);
  virtual void broadcast_host(void* buf, size_t bytes, int root, const std::string& what);

  // Ends every rank of the job: prints `msg` on stderr and exits with `code` (MPI_Abort
  // under MPI, which makes mpirun kill the other ranks). Does not return.
  [[noreturn]] virtual void abort(const std::string& msg, int code);
  // Orderly shutdown (MPI_Finalize); later operations are errors.
  virtual void finalize() {}

 protected:
  int rank_ = 0, world_ = 1, local_rank_ = 0;
};

// dst[i] = round_fmt(dst[i] + src[i]) for n elements of F32 (fmt F32, BF16 or F16) or F64
// storage: the reduction arithmetic (host memory).
void add_rounded(void* dst, const void* src, int64_t n, DType storage, DType fmt);

std::unique_ptr<Communicator> make_single_comm();

// Initialises MPI (once per process). Throws st::Error in a build without MPI.
std::unique_ptr<Communicator> make_mpi_comm(double timeout_s);
bool mpi_built();

struct NcclOptions {
  std::string bootstrap = "mpi";  // mpi | file | tcp: how rank 0's unique id reaches the others
  std::string rendezvous;         // file: a path on a shared file system; tcp: host:port
  double timeout_s = 300;
};
// Picks the GPU of the local rank (cudaSetDevice(local_rank)). Throws st::Error in a build
// without NCCL, without a GPU, or when the rendezvous does not complete within timeout_s.
std::unique_ptr<Communicator> make_nccl_comm(const NcclOptions& opt);
bool nccl_built();

}  // namespace st
