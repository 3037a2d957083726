// Data-parallel training (issue 10, docs/distributed.md).
//
// CPU build (label cpu, needs MPI: Debian openmpi-bin + libopenmpi-dev): real `train` runs
// under `mpirun -np N` against one process with the same global batch --
//   * 2 ranks (plain and ZeRO-1) and 3 ranks (ZeRO-1, bf16, hooks on) give the losses, grad
//     norms, validation losses, hook files and weights of one process with
//     grad_accum_steps = N and train.grad_accum_mode separate bit for bit; against the
//     default fused accumulation the observed difference is printed and bounded;
//   * the real tiny config (configs/tiny_shakespeare.yaml) on 2 ranks, same check;
//   * a 2-rank ZeRO-1 checkpoint resumes on 2 ranks bit-exactly; other rank counts and
//     dist.zero changes are refused with a clear message;
//   * a rank that dies, hangs (dist.timeout_s) or fails while writing a checkpoint ends
//     every rank within a bounded time, and no half-written checkpoint is resumed from;
//   * the file and TCP rendezvous, partitions, the reduction arithmetic, launcher detection.
// Without MPI only the refusal of dist.backend mpi is tested.
//
// The real runs under mpirun: test_distributed_mpi.cpp (CPU build with MPI only); the shared
// harness: distributed_fixture.h.
//
// GPU build (ST_DIST_GPU_TESTS, label gpu; fails without a GPU): the NCCL communicator with
// one rank on device buffers.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "dist/comm.h"
#include "dist/rendezvous.h"
#include "distributed_fixture.h"
#include "test_util.h"
#include "io/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

#ifdef ST_DIST_GPU_TESTS
#include <cuda_runtime.h>
#endif

using namespace st::dist_test;

#ifndef ST_DIST_GPU_TESTS

// ---- pieces, in process ----

TEST(Dist, PartitionAlignsAndCovers) {
  const Partition p(118528, 2, 65536);
  EXPECT_EQ(p.begin(0), 0);
  EXPECT_EQ(p.end(0), 65536);
  EXPECT_EQ(p.end(1), 118528);
  const Partition q(10, 4);
  EXPECT_EQ(q.offsets(), (std::vector<int64_t>{0, 3, 6, 9, 10}));
  const Partition e(100, 3, 64);  // the last rank may own nothing
  EXPECT_EQ(e.offsets(), (std::vector<int64_t>{0, 64, 100, 100}));
  EXPECT_EQ(e.max_count(), 64);
  // 124M, 8 ranks: 64K-aligned parts of 15,597,568; the last one 15,292,928.
  const Partition g(124475904, 8, 65536);
  for (int r = 0; r < 7; ++r) EXPECT_EQ(g.count(r), 15597568);
  EXPECT_EQ(g.count(7), 15292928);
  EXPECT_THROW(Partition(std::vector<int64_t>{0, 5, 3}), Error);
}

TEST(Dist, AddRoundedIsTheAccumulationArithmetic) {
  std::vector<float> a = {1.0f, 1.0f, 3.0f}, b = {1.0f / 256, 3.0f / 512, 1e-8f};
  std::vector<float> c = a;
  add_rounded(c.data(), b.data(), 3, DType::F32, DType::F32);
  EXPECT_EQ(c[0], 1.0f + 1.0f / 256);
  add_rounded(a.data(), b.data(), 3, DType::F32, DType::BF16);  // round to 8 bits of mantissa
  EXPECT_EQ(a[0], 1.0f);                // 1 + 2^-8: a tie, to even
  EXPECT_EQ(a[1], 1.0f + 1.0f / 128);   // 1 + 1.5 * 2^-8: up
  EXPECT_EQ(a[2], 3.0f);
}

TEST(Dist, LaunchInfoFromLauncherEnvironment) {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "RANK", "WORLD_SIZE",
                        "LOCAL_RANK"})
    unsetenv(v);
  EXPECT_EQ(launch_info().world, 1);
  EXPECT_EQ(launch_info().launcher, "none");
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "16", 1);
  setenv("SLURM_LOCALID", "1", 1);
  LaunchInfo li = launch_info();
  EXPECT_EQ(li.rank, 5);
  EXPECT_EQ(li.world, 16);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.launcher, "slurm");
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);  // mpirun's variables win
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  li = launch_info();
  EXPECT_EQ(li.launcher, "mpirun");
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.world, 4);
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"})
    unsetenv(v);
}

TEST(Dist, ConfigSection) {
  const Config c = parse_config("dist: {backend: mpi, zero: 1, timeout_s: 30, nccl_bootstrap: tcp,"
                                " rendezvous: 'node1:29500'}\n",
                                "d.yaml");
  EXPECT_EQ(c.dist.backend, "mpi");
  EXPECT_EQ(c.dist.zero, 1);
  EXPECT_EQ(c.dist.timeout_s, 30.0);
  EXPECT_EQ(c.dist.rendezvous, "node1:29500");
  auto err = [](const std::string& y) {
    try {
      parse_config(y, "d.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_HAS(err("dist: {backend: gloo}\n"), "dist.backend: expected one of auto|none|mpi|nccl");
  EXPECT_HAS(err("dist: {zero: 2}\n"), "dist.zero = 2 is out of range");
  EXPECT_HAS(err("dist: {timeout_s: 0}\n"), "dist.timeout_s");
  EXPECT_HAS(err("train: {grad_accum_mode: tree}\n"), "fused|separate");
  const std::string help = config_help();
  for (const char* k : {"dist.backend", "dist.zero", "dist.timeout_s", "dist.nccl_bootstrap",
                        "dist.rendezvous", "train.grad_accum_mode"})
    EXPECT_HAS(help, std::string("  ") + k + " ");
  const Config back = parse_config(config_to_yaml(c), "back.yaml");
  EXPECT_EQ(back.dist.nccl_bootstrap, "tcp");
  EXPECT_EQ(back.dist.zero, 1);
}

TEST(Dist, FileRendezvous) {
  const std::string path = (tmp_root() / "rdv_id").string();
  const std::vector<uint8_t> id = {1, 2, 3, 250, 0, 7};
  std::vector<uint8_t> got1, got2;
  std::thread r1([&] { got1 = rendezvous_file(path, 1, 3, {}, 10); });
  std::thread r2([&] { got2 = rendezvous_file(path, 2, 3, {}, 10); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the others wait for it
  EXPECT_EQ(rendezvous_file(path, 0, 3, id, 10), id);
  r1.join();
  r2.join();
  EXPECT_EQ(got1, id);
  EXPECT_EQ(got2, id);
  // A stale file: rank 0 refuses it, a reader of another world size refuses it.
  try {
    rendezvous_file(path, 0, 3, id, 10);
    ADD_FAILURE() << "stale rendezvous file accepted";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "already exists");
  }
  try {
    rendezvous_file(path, 1, 4, {}, 10);
    ADD_FAILURE() << "rendezvous of another world size accepted";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "job of 3 ranks, this job has 4");
  }
  rendezvous_file_done(path);
  // Rank 0 never comes: an error naming the timeout, in about timeout_s.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    rendezvous_file(path, 1, 2, {}, 0.5);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "did not complete within dist.timeout_s = 0.5 s");
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
}

TEST(Dist, TcpRendezvous) {
  const std::string addr = "127.0.0.1:" + std::to_string(20000 + getpid() % 20000);
  const std::vector<uint8_t> id(128, 42);
  std::vector<uint8_t> got1, got2;
  std::thread r1([&] { got1 = rendezvous_tcp(addr, 1, 3, {}, 10); });  // before rank 0 listens
  std::thread r0([&] { EXPECT_EQ(rendezvous_tcp(addr, 0, 3, id, 10), id); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  std::thread r2([&] { got2 = rendezvous_tcp(addr, 2, 3, {}, 10); });
  r0.join();
  r1.join();
  r2.join();
  EXPECT_EQ(got1, id);
  EXPECT_EQ(got2, id);
  // Nobody listens / nobody connects: errors within the timeout.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    rendezvous_tcp(addr, 1, 2, {}, 0.5);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "did not complete within dist.timeout_s = 0.5 s");
    EXPECT_HAS(std::string(e.what()), "rank 0 never answered");
  }
  try {
    rendezvous_tcp(addr, 0, 2, id, 0.5);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "0 of 1 ranks connected");
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4.0);
}

#ifndef ST_MPIEXEC

TEST(Dist, MpiBackendRefusedWithoutMpi) {
  EXPECT_FALSE(mpi_built());
  Config c = parse_config(base_yaml(dir_of("nompi"), "fp32", 1, "dist: {backend: mpi}\n"), "x.yaml");
  TrainOptions o;
  o.console = false;
  try {
    run_training(c, o);
    ADD_FAILURE() << "dist.backend mpi accepted without MPI";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "this build has no MPI");
  }
}

#endif  // !ST_MPIEXEC

#else  // ST_DIST_GPU_TESTS: the NCCL communicator on the GPU, one rank

namespace {
void ck(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }
}  // namespace

TEST(NcclGpu, OneRankCollectivesOnDeviceBuffers) {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                        "SLURM_NTASKS", "RANK", "WORLD_SIZE"})
    unsetenv(v);
  int ndev = 0;
  ASSERT_EQ(cudaGetDeviceCount(&ndev), cudaSuccess) << "no CUDA device";
  ASSERT_GT(ndev, 0) << "no CUDA device";
  NcclOptions o;
  o.bootstrap = "file";  // one rank: no peer to reach; the id stays local
  o.rendezvous = (tmp_root() / "nccl_id").string();
  o.timeout_s = 60;
  std::unique_ptr<Communicator> c = make_nccl_comm(o);
  ASSERT_TRUE(nccl_built());
  EXPECT_EQ(c->name(), "nccl");
  EXPECT_TRUE(c->device_buffers());
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world(), 1);
  const int n = 1000;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = 0.5f * i - 3.0f;
  float* d = nullptr;
  ck(cudaMalloc(&d, n * sizeof(float)));
  ck(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  const Partition p(n, 1);
  c->all_reduce(d, n, DType::F32, DType::F32, "test all-reduce");
  c->reduce_scatter(d, p, DType::F32, DType::F32, "test reduce-scatter");
  c->all_gather(d, p, DType::F32, "test all-gather");
  c->broadcast(d, n * sizeof(float), 0, "test broadcast");
  c->barrier("test barrier");
  std::vector<float> back(n);
  ck(cudaMemcpy(back.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, h) << "one rank: every collective is the identity";
  // bf16 device storage.
  uint16_t* b = nullptr;
  ck(cudaMalloc(&b, n * sizeof(uint16_t)));
  std::vector<uint16_t> hb(n);
  for (int i = 0; i < n; ++i) hb[i] = static_cast<uint16_t>(0x3f80 + i % 64);
  ck(cudaMemcpy(b, hb.data(), n * 2, cudaMemcpyHostToDevice));
  c->all_reduce(b, n, DType::BF16, DType::BF16, "test bf16 all-reduce");
  std::vector<uint16_t> bb(n);
  ck(cudaMemcpy(bb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(bb, hb);
  double x[3] = {1.5, -2.0, 1e300};
  c->all_reduce_host(x, 3, "test host all-reduce");
  EXPECT_EQ(x[0], 1.5);
  EXPECT_EQ(x[2], 1e300);
  // FP32 storage of bf16 values (the CPU emulation) cannot go through NCCL.
  EXPECT_THROW(c->all_reduce(d, n, DType::F32, DType::BF16, "x"), Error);
  c->finalize();
  cudaFree(d);
  cudaFree(b);
}

#endif  // ST_DIST_GPU_TESTS

