// A tensor-parallel group of processes on this machine for the model tools (check-golden
// --tensor-parallel-size N): rank 0 is the calling process, ranks 1..N-1 are children running the
// same command with `--tp-join ADDRESS/GROUP --tp-rank R` added. The group forms over Gloo
// through a rendezvous store rank 0 serves on loopback; the group's token reaches the children on
// their standard input, never on a command line.
//
// Every rank then runs the same program with its own Communicator: SPMD, each rank making the
// same calls in the same order (the tools are deterministic), as the workers of a serving node do
// under the coordinator's plan.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/child_process.h"
#include "parallel/communicator.h"
#include "parallel/rendezvous_service.h"
#include "parallel/rendezvous_store.h"

namespace dsv4::cli {

class LocalRanks {
 public:
  // Rank 0: serves the store, spawns ranks 1..world-1 as `/proc/self/exe args... --tp-join ...
  // --tp-rank R` and forms the group. Errors name the rank that failed; children are killed.
  static absl::StatusOr<std::unique_ptr<LocalRanks>> Start(int world_size,
                                                          const std::vector<std::string>& args);
  // Ranks 1..N-1: reads the token from standard input and joins the group at `join`
  // ("host:port/group").
  static absl::StatusOr<std::unique_ptr<Communicator>> Join(const std::string& join, int rank,
                                                            int world_size);
  // (Children still running when it goes away are killed.)

  Communicator& comm() { return *comm_; }
  // Waits up to `timeout_s` for every child; OK when all exited 0, else an error naming the
  // first rank that failed (its exit status or signal). Children still running are killed.
  absl::Status Wait(int timeout_s);

 private:
  LocalRanks() = default;

  RendezvousStore store_;
  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<Communicator> comm_;
  std::vector<ChildProcess> children_;  // rank r at r - 1
};

}  // namespace dsv4::cli
