// The MPI communicator (host buffers): CPU data parallelism under mpirun.
//
// Every operation is a non-blocking MPI call completed by an MPI_Test loop with a deadline
// (dist.timeout_s), so a rank that died or hangs turns into an error naming the operation
// instead of a job that waits forever; the trainer then ends every rank (MPI_Abort).
//
// reduce_scatter does not use MPI_Reduce_scatter / MPI_Allreduce, whose summation order is
// the library's choice. Each part's owner receives every other rank's copy of its part
// (MPI_Ialltoallv, in rounds of at most kChunkBytes per peer so the receive buffer stays
// small) and adds the W copies in rank order with the model's accumulation arithmetic
// (add_rounded). Per rank it sends and receives (W-1)/W of the buffer, the volume of a ring
// reduce-scatter.
// MPI's C API only (no C++ bindings: they would need libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"

namespace st {

bool mpi_built() { return true; }

namespace {

constexpr int64_t kChunkBytes = int64_t(8) << 20;

std::string mpi_error(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, len);
}

MPI_Datatype mpi_type(DType storage) {
  switch (storage) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;  // moved, never added
  }
  return MPI_BYTE;
}

int to_int(int64_t v, const char* what) {
  ST_CHECK(v >= 0 && v <= INT_MAX, "mpi: ", what, " = ", v,
           " does not fit MPI's int counts (more than 2^31 elements per part)");
  return static_cast<int>(v);
}

class MpiComm final : public Communicator {
 public:
  explicit MpiComm(double timeout_s) : timeout_s_(timeout_s) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) fail("dist: MPI was already finalized in this process (one distributed run per process)");
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      if (rc != MPI_SUCCESS) fail("dist: MPI_Init_thread failed: ", mpi_error(rc));
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    MPI_Comm node;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type");
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
  }
  // No MPI_Finalize here: a rank unwinding from an error must not wait for the others
  // (the trainer aborts instead); finalize() is the orderly end.
  ~MpiComm() override = default;

  std::string name() const override { return "mpi"; }

  void reduce_scatter(void* buf, const Partition& p, DType storage, DType fmt,
                      const std::string& what) override {
    ST_CHECK(p.world() == world_, "mpi reduce_scatter: partition over ", p.world(),
             " ranks, communicator of ", world_);
    if (world_ == 1) return;
    const size_t esz = dtype_size(storage);
    const int64_t chunk =
        std::max<int64_t>(1, std::min<int64_t>(p.max_count(), kChunkBytes / int64_t(esz)));
    const int64_t rounds = (p.max_count() + chunk - 1) / chunk;
    recv_.resize(static_cast<size_t>(world_) * chunk * esz);
    std::vector<int> sc(world_), sd(world_), rc(world_), rd(world_);
    const MPI_Datatype t = mpi_type(storage);
    char* base = static_cast<char*>(buf);
    const int64_t mine = p.count(rank_);
    for (int64_t k = 0; k < rounds; ++k) {
      const int64_t off = k * chunk;
      auto part = [&](int64_t count) { return std::clamp<int64_t>(count - off, 0, chunk); };
      for (int q = 0; q < world_; ++q) {
        const int64_t s = q == rank_ ? 0 : part(p.count(q));
        sc[q] = to_int(s, "send count");
        sd[q] = to_int(s > 0 ? p.begin(q) + off : 0, "send offset");
        rc[q] = to_int(q == rank_ ? 0 : part(mine), "receive count");
        rd[q] = to_int(int64_t(q) * chunk, "receive offset");
      }
      MPI_Request req;
      check(MPI_Ialltoallv(buf, sc.data(), sd.data(), t, recv_.data(), rc.data(), rd.data(), t,
                           comm_, &req),
            "MPI_Ialltoallv", what);
      wait(req, what, "reduce-scatter");
      const int64_t n = part(mine);
      if (n == 0) continue;
      // Slot `rank` of the receive buffer takes this rank's own copy; the sum builds in slot 0.
      char* dst = base + (p.begin(rank_) + off) * esz;
      auto slot = [&](int q) { return recv_.data() + size_t(q) * chunk * esz; };
      std::memcpy(slot(rank_), dst, n * esz);
      for (int q = 1; q < world_; ++q) add_rounded(slot(0), slot(q), n, storage, fmt);
      std::memcpy(dst, slot(0), n * esz);
    }
  }

  void all_gather(void* buf, const Partition& p, DType storage, const std::string& what) override {
    ST_CHECK(p.world() == world_, "mpi all_gather: partition over ", p.world(),
             " ranks, communicator of ", world_);
    if (world_ == 1) return;
    std::vector<int> counts(world_), displs(world_);
    for (int q = 0; q < world_; ++q) {
      counts[q] = to_int(p.count(q), "all-gather count");
      displs[q] = to_int(p.begin(q), "all-gather offset");
    }
    MPI_Request req;
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(),
                          mpi_type(storage), comm_, &req),
          "MPI_Iallgatherv", what);
    wait(req, what, "all-gather");
  }

  void broadcast(void* buf, size_t bytes, int root, const std::string& what) override {
    if (world_ == 1) return;
    char* p = static_cast<char*>(buf);
    constexpr size_t kMax = size_t(1) << 30;
    do {
      const size_t n = std::min(bytes, kMax);
      MPI_Request req;
      check(MPI_Ibcast(p, static_cast<int>(n), MPI_BYTE, root, comm_, &req), "MPI_Ibcast", what);
      wait(req, what, "broadcast");
      p += n;
      bytes -= n;
    } while (bytes > 0);
  }

  void barrier(const std::string& what) override {
    if (world_ == 1) return;
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", what);
    wait(req, what, "barrier");
  }

  [[noreturn]] void abort(const std::string& msg, int code) override {
    if (!msg.empty()) std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; in case it does
  }

  void finalize() override {
    if (done_) return;
    done_ = true;
    MPI_Comm_free(&comm_);
    MPI_Finalize();
  }

 private:
  void check(int rc, const char* call, const std::string& what = "") {
    if (rc == MPI_SUCCESS) return;
    fail("rank ", rank_, " of ", world_, ": ", call, what.empty() ? "" : " (", what,
         what.empty() ? "" : ")", " failed: ", mpi_error(rc));
  }

  // Completes req or throws once dist.timeout_s has passed.
  void wait(MPI_Request& req, const std::string& what, const char* op) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    long spins = 0;
    for (;;) {
      int done = 0;
      MPI_Status status;
      const int rc = MPI_Test(&req, &done, &status);
      if (rc != MPI_SUCCESS)
        fail("rank ", rank_, " of ", world_, ": ", op, " of ", what, " failed: ", mpi_error(rc),
             " (another rank died?)");
      if (done) return;
      const double waited = std::chrono::duration<double>(clock::now() - t0).count();
      if (waited > timeout_s_)
        fail("rank ", rank_, " of ", world_, ": ", op, " of ", what,
             " did not complete within dist.timeout_s = ", timeout_s_,
             " s: another rank died, hangs, or spends longer than that between collective "
             "operations (raise dist.timeout_s if checkpoints or evaluations take longer)");
      if (++spins > 2000)
        std::this_thread::sleep_for(std::chrono::microseconds(waited > 1.0 ? 1000 : 20));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  double timeout_s_;
  bool done_ = false;
  std::vector<char> recv_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_comm(double timeout_s) {
  return std::make_unique<MpiComm>(timeout_s);
}

}  // namespace st
