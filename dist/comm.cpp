// Communicator basics: launcher environment, partitions, the reduction arithmetic and the
// single-process communicator. MPI: dist/mpi_comm.cpp; NCCL: dist/nccl_comm.cpp.
#include "dist/comm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace st {

namespace {

// An environment variable as a non-negative int; -1 when unset or not a number.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 30)) return -1;
  return static_cast<int>(x);
}

}  // namespace

LaunchInfo launch_info() {
  struct Vars {
    const char *rank, *world, *local, *name;
  };
  static const Vars kVars[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "slurm"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "env"},
  };
  for (const Vars& v : kVars) {
    const int r = env_int(v.rank), w = env_int(v.world);
    if (r < 0 || w < 1) continue;
    ST_CHECK(r < w, "launcher environment: ", v.rank, " = ", r, " is not below ", v.world,
             " = ", w);
    LaunchInfo li;
    li.rank = r;
    li.world = w;
    li.local_rank = std::max(0, env_int(v.local));
    li.launcher = v.name;
    return li;
  }
  return {};
}

Partition::Partition(int64_t n, int world, int64_t align) {
  ST_CHECK(n >= 0 && world >= 1 && align >= 1, "partition of ", n, " elements over ", world,
           " ranks, alignment ", align);
  const int64_t per = (n + world - 1) / world;
  const int64_t part = (per + align - 1) / align * align;
  off_.assign(world + 1, 0);
  for (int r = 0; r <= world; ++r) off_[r] = std::min(n, part * r);
  off_[world] = n;
}

Partition::Partition(std::vector<int64_t> offsets) : off_(std::move(offsets)) {
  ST_CHECK(off_.size() >= 2 && off_[0] == 0, "partition: ", off_.size(),
           " offsets (need world + 1, starting at 0)");
  for (size_t i = 1; i < off_.size(); ++i)
    ST_CHECK(off_[i] >= off_[i - 1], "partition: offsets decrease at ", i);
}

int64_t Partition::max_count() const {
  int64_t m = 0;
  for (int r = 0; r < world(); ++r) m = std::max(m, count(r));
  return m;
}

void Communicator::all_reduce(void* buf, int64_t n, DType storage, DType fmt,
                              const std::string& what) {
  if (world_ == 1) return;
  const Partition p(n, world_);
  reduce_scatter(buf, p, storage, fmt, what);
  all_gather(buf, p, storage, what);
}

void Communicator::all_reduce_host(double* x, int64_t n, const std::string& what) {
  ST_CHECK(!device_buffers(), name(), " communicator: all_reduce_host not implemented");
  all_reduce(x, n, DType::F64, DType::F64, what);
}

void Communicator::all_gather_host(double* x, const Partition& p, const std::string& what) {
  ST_CHECK(!device_buffers(), name(), " communicator: all_gather_host not implemented");
  all_gather(x, p, DType::F64, what);
}

void Communicator::broadcast_host(void* buf, size_t bytes, int root, const std::string& what) {
  ST_CHECK(!device_buffers(), name(), " communicator: broadcast_host not implemented");
  broadcast(buf, bytes, root, what);
}

void Communicator::abort(const std::string& msg, int code) {
  if (!msg.empty()) std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(code);
}

void add_rounded(void* dst, const void* src, int64_t n, DType storage, DType fmt) {
  if (storage == DType::F64) {
    double* d = static_cast<double*>(dst);
    const double* s = static_cast<const double*>(src);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = d[i] + s[i];
    return;
  }
  ST_CHECK(storage == DType::F32, "add_rounded: host reduction of ", dtype_name(storage),
           " storage (expected fp32 or fp64)");
  float* d = static_cast<float*>(dst);
  const float* s = static_cast<const float*>(src);
  if (fmt == DType::F32 || fmt == DType::F64) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = d[i] + s[i];
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = round_to(fmt, d[i] + s[i]);
  }
}

namespace {

class SingleComm final : public Communicator {
 public:
  std::string name() const override { return "single"; }
  void reduce_scatter(void*, const Partition& p, DType, DType, const std::string&) override {
    ST_CHECK(p.world() == 1, "single communicator: partition over ", p.world(), " ranks");
  }
  void all_gather(void*, const Partition& p, DType, const std::string&) override {
    ST_CHECK(p.world() == 1, "single communicator: partition over ", p.world(), " ranks");
  }
  void all_reduce(void*, int64_t, DType, DType, const std::string&) override {}
  void broadcast(void*, size_t, int root, const std::string&) override {
    ST_CHECK(root == 0, "single communicator: broadcast from rank ", root);
  }
  void barrier(const std::string&) override {}
};

}  // namespace

std::unique_ptr<Communicator> make_single_comm() { return std::make_unique<SingleComm>(); }

#ifndef ST_WITH_MPI
bool mpi_built() { return false; }
std::unique_ptr<Communicator> make_mpi_comm(double) {
  fail("dist.backend mpi: this build has no MPI (install libopenmpi-dev openmpi-bin and "
       "rebuild; CMake finds MPI with find_package(MPI))");
}
#endif

#ifndef ST_WITH_NCCL
bool nccl_built() { return false; }
std::unique_ptr<Communicator> make_nccl_comm(const NcclOptions&) {
  fail("dist.backend nccl: this build has no NCCL (it needs the CUDA backend and nccl.h / "
       "libnccl from the CUDA toolkit; reconfigure with -DSTABLETRAIN_CUDA=ON)");
}
#endif

}  // namespace st
