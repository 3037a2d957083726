// The NCCL communicator (device buffers). Built with the CUDA backend when CMake finds
// nccl.h and libnccl (the CUDA toolkit's copy); plain C++ on the CUDA runtime API.
//
// Setup: the GPU is the local rank's (cudaSetDevice(local_rank); fewer visible GPUs than
// ranks on a node is an error). Rank 0's ncclUniqueId reaches the other ranks through
// dist.nccl_bootstrap: mpi (MPI_Bcast; the build needs MPI and the job mpirun), file (a path
// on a shared file system) or tcp (rank 0's host:port), see dist/rendezvous.h. The
// communicator is created non-blocking (ncclConfig_t.blocking = 0) and every step -- the
// init and each collective -- is polled against dist.timeout_s; on expiry the communicator
// is aborted (ncclCommAbort) and an error names the operation.
//
// reduce_scatter / all_gather use grouped ncclReduce / ncclBroadcast, one per rank's part,
// so parts may differ in size (no padding). Summation order is NCCL's (ring or tree), not
// the MPI communicator's rank order: multi-GPU runs are not bit-identical to one GPU.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/rendezvous.h"

namespace st {

bool nccl_built() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("nccl communicator: ", what, ": ", cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType storage) {
  switch (storage) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
  }
  return ncclUint8;
}

class NcclComm final : public Communicator {
 public:
  explicit NcclComm(const NcclOptions& opt) : opt_(opt) {
    const LaunchInfo li = launch_info();
    if (opt.bootstrap == "mpi") {
      host_ = make_mpi_comm(opt.timeout_s);  // throws in a build without MPI
      rank_ = host_->rank();
      world_ = host_->world();
      local_rank_ = host_->local_rank();
    } else {
      rank_ = li.rank;
      world_ = li.world;
      local_rank_ = li.local_rank;
    }
    int ndev = 0;
    const cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0)
      fail("dist.backend nccl: rank ", rank_, " sees no CUDA device (",
           e == cudaSuccess ? "0 devices" : cudaGetErrorString(e), ")");
    if (local_rank_ >= ndev)
      fail("dist.backend nccl: rank ", rank_, " is local rank ", local_rank_, " on its node but ",
           ndev, " GPU(s) are visible there (start at most one rank per GPU)");
    device_ = local_rank_;
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");

    ncclUniqueId id{};
    if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<uint8_t> blob(reinterpret_cast<uint8_t*>(&id),
                              reinterpret_cast<uint8_t*>(&id) + sizeof id);
    if (world_ > 1) {
      if (opt.bootstrap == "mpi") {
        host_->broadcast(blob.data(), blob.size(), 0, "the NCCL unique id");
      } else if (opt.bootstrap == "file") {
        blob = rendezvous_file(opt.rendezvous, rank_, world_, blob, opt.timeout_s);
      } else if (opt.bootstrap == "tcp") {
        blob = rendezvous_tcp(opt.rendezvous, rank_, world_, blob, opt.timeout_s);
      } else {
        fail("dist.nccl_bootstrap: '", opt.bootstrap, "' (expected mpi, file or tcp)");
      }
      ST_CHECK(blob.size() == sizeof id, "NCCL unique id of ", blob.size(), " bytes");
      std::memcpy(&id, blob.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) nccl_check(r, "ncclCommInitRankConfig");
    settle("communicator setup (ncclCommInitRankConfig: waiting for every rank to join)");
    if (rank_ == 0 && opt.bootstrap == "file" && world_ > 1) rendezvous_file_done(opt.rendezvous);
  }

  ~NcclComm() override {
    if (comm_) ncclCommAbort(comm_);
    if (stream_) cudaStreamDestroy(stream_);
    if (scratch_) cudaFree(scratch_);
  }

  std::string name() const override { return "nccl"; }
  bool device_buffers() const override { return true; }

  void reduce_scatter(void* buf, const Partition& p, DType storage, DType fmt,
                      const std::string& what) override {
    check_fmt(storage, fmt);
    ST_CHECK(p.world() == world_, "nccl reduce_scatter: partition over ", p.world(), " ranks");
    if (world_ == 1) return;
    char* b = static_cast<char*>(buf);
    const size_t esz = dtype_size(storage);
    group([&] {
      for (int q = 0; q < world_; ++q)
        if (p.count(q) > 0)
          nccl_check(ncclReduce(b + p.begin(q) * esz, b + p.begin(q) * esz, size_t(p.count(q)),
                                nccl_type(storage), ncclSum, q, comm_, stream_),
                     "ncclReduce");
    }, what, "reduce-scatter");
  }

  void all_gather(void* buf, const Partition& p, DType storage, const std::string& what) override {
    ST_CHECK(p.world() == world_, "nccl all_gather: partition over ", p.world(), " ranks");
    if (world_ == 1) return;
    char* b = static_cast<char*>(buf);
    const size_t esz = dtype_size(storage);
    group([&] {
      for (int q = 0; q < world_; ++q)
        if (p.count(q) > 0)
          nccl_check(ncclBroadcast(b + p.begin(q) * esz, b + p.begin(q) * esz, size_t(p.count(q)),
                                   nccl_type(storage), q, comm_, stream_),
                     "ncclBroadcast");
    }, what, "all-gather");
  }

  void all_reduce(void* buf, int64_t n, DType storage, DType fmt, const std::string& what) override {
    check_fmt(storage, fmt);
    if (world_ == 1 || n == 0) return;
    group([&] {
      nccl_check(ncclAllReduce(buf, buf, size_t(n), nccl_type(storage), ncclSum, comm_, stream_),
                 "ncclAllReduce");
    }, what, "all-reduce");
  }

  void broadcast(void* buf, size_t bytes, int root, const std::string& what) override {
    if (world_ == 1 || bytes == 0) return;
    group([&] {
      nccl_check(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    }, what, "broadcast");
  }

  void barrier(const std::string& what) override {
    if (host_) return host_->barrier(what);
    double one = 1;
    all_reduce_host(&one, 1, what);
  }

  void all_reduce_host(double* x, int64_t n, const std::string& what) override {
    if (host_) return host_->all_reduce_host(x, n, what);
    if (world_ == 1 || n == 0) return;
    void* d = stage(x, n * sizeof(double));
    all_reduce(d, n, DType::F64, DType::F64, what);
    unstage(x, n * sizeof(double));
  }

  void all_gather_host(double* x, const Partition& p, const std::string& what) override {
    if (host_) return host_->all_gather_host(x, p, what);
    if (world_ == 1) return;
    void* d = stage(x, p.size() * sizeof(double));
    all_gather(d, p, DType::F64, what);
    unstage(x, p.size() * sizeof(double));
  }

  void broadcast_host(void* buf, size_t bytes, int root, const std::string& what) override {
    if (host_) return host_->broadcast_host(buf, bytes, root, what);
    if (world_ == 1 || bytes == 0) return;
    void* d = stage(buf, bytes);
    broadcast(d, bytes, root, what);
    unstage(buf, bytes);
  }

  [[noreturn]] void abort(const std::string& msg, int code) override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    if (host_) host_->abort(msg, code);
    Communicator::abort(msg, code);
  }

  void finalize() override {
    if (comm_) {
      ncclCommFinalize(comm_);
      settle("communicator shutdown (ncclCommFinalize)");
      ncclCommDestroy(comm_);
      comm_ = nullptr;
    }
    if (host_) host_->finalize();
  }

 private:
  void nccl_check(ncclResult_t r, const char* call) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    fail("rank ", rank_, " of ", world_, ": ", call, " failed: ", ncclGetErrorString(r),
         r == ncclRemoteError ? " (another rank died?)" : "");
  }

  static void check_fmt(DType storage, DType fmt) {
    ST_CHECK(storage == fmt || (storage == DType::F32 && fmt == DType::F32) ||
                 (storage == DType::F64 && fmt == DType::F64),
             "nccl: ", dtype_name(fmt), " values in ", dtype_name(storage),
             " storage (the CPU emulation's layout) cannot be summed by NCCL");
  }

  [[noreturn]] void timeout(const std::string& what, const char* op) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    fail("rank ", rank_, " of ", world_, ": ", op, " of ", what,
         " did not complete within dist.timeout_s = ", opt_.timeout_s,
         " s: another rank died, hangs, or spends longer than that between collective "
         "operations");
  }

  // Waits until the communicator's pending non-blocking call has been issued.
  void settle(const std::string& what) {
    const auto t0 = Clock::now();
    for (;;) {
      ncclResult_t st = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) nccl_check(st, what.c_str());
      if (std::chrono::duration<double>(Clock::now() - t0).count() > opt_.timeout_s)
        timeout(what, "NCCL");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Issues `calls` in an NCCL group on the stream, then waits for the stream.
  template <class F>
  void group(F&& calls, const std::string& what, const char* op) {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    calls();
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    settle(what);
    const auto t0 = Clock::now();
    long spins = 0;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda_check(e, "cudaStreamQuery");
      ncclResult_t st = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(comm_, &st), "ncclCommGetAsyncError");
      if (st != ncclSuccess && st != ncclInProgress) nccl_check(st, op);
      if (std::chrono::duration<double>(Clock::now() - t0).count() > opt_.timeout_s)
        timeout(what, op);
      if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void* stage(const void* host, size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_) cudaFree(scratch_);
      scratch_ = nullptr;
      cuda_check(cudaMalloc(&scratch_, bytes), "cudaMalloc (staging buffer)");
      scratch_bytes_ = bytes;
    }
    cuda_check(cudaMemcpy(scratch_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    return scratch_;
  }
  void unstage(void* host, size_t bytes) {
    cuda_check(cudaMemcpy(host, scratch_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }

  NcclOptions opt_;
  std::unique_ptr<Communicator> host_;  // MPI, with nccl_bootstrap mpi: host-side operations
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_comm(const NcclOptions& opt) {
  return std::make_unique<NcclComm>(opt);
}

}  // namespace st
