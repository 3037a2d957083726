// Rendezvous without MPI: rank 0 hands a small blob (NCCL's unique id) to the other ranks of
// a job through a shared file or a TCP connection (dist.nccl_bootstrap: file | tcp). Both
// give up with an error naming the rendezvous once timeout_s has passed, so a rank that
// never arrives cannot hang the others.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace st {

// File: rank 0 writes `blob` to `path` (atomically: a temporary file, then rename) and
// refuses a path that already exists (a stale file of an earlier job: remove it, or use a
// fresh path per job, e.g. with $SLURM_JOB_ID in it); ranks > 0 wait for the file and read
// it. The file also holds the world size, checked by the readers. Rank 0 removes the file
// with rendezvous_file_done() once every rank has joined.
std::vector<uint8_t> rendezvous_file(const std::string& path, int rank, int world,
                                     const std::vector<uint8_t>& blob, double timeout_s);
void rendezvous_file_done(const std::string& path);

// TCP: `address` is host:port of rank 0. Rank 0 listens on the port (all interfaces) and
// sends `blob` to world - 1 connections; ranks > 0 connect (retrying until rank 0 listens)
// and read it. Returns the blob on every rank.
std::vector<uint8_t> rendezvous_tcp(const std::string& address, int rank, int world,
                                    const std::vector<uint8_t>& blob, double timeout_s);

}  // namespace st
