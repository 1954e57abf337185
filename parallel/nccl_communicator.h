// The Communicator of GPU ranks: NCCL (communicator.h's contract). Device buffers; every
// collective is enqueued on the caller's stream, so it is stream-ordered and can be captured in a
// CUDA graph. Built into the CUDA plugin only (worker/cuda, links NCCL); the host side reaches it
// through worker/cuda_plugin.h (NcclUniqueId, CreateNcclCommunicator).
//
// The communicator is created non-blocking (ncclConfig_t.blocking = 0): init and every call that
// returns ncclInProgress are waited for by polling ncclCommGetAsyncError up to the timeout, so a
// missing peer gives DEADLINE_EXCEEDED, not a hang. A watchdog thread polls the async error while
// the communicator lives; an error (or Abort) calls ncclCommAbort, which ends work in flight, and
// breaks the communicator: later calls return that first error.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"

namespace dsv4 {

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;             // this rank's CUDA device
  std::string unique_id;      // ncclUniqueId bytes, the same on every rank (NewNcclUniqueId)
  std::chrono::milliseconds init_timeout{60000};
  std::chrono::milliseconds op_timeout{60000};  // for calls that return ncclInProgress
};

// A fresh ncclUniqueId (128 bytes): rank 0's coordinator makes it and sends it to every rank.
absl::StatusOr<std::string> NewNcclUniqueId();

class NcclCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(const NcclOptions& options);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  std::string backend_name() const override { return "nccl"; }

  absl::Status AllReduceSum(const void* send, void* recv, size_t count, DType dtype,
                            void* stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                         void* stream) override;
  absl::Status Broadcast(void* buf, size_t count, DType dtype, int root, void* stream) override;
  absl::Status Barrier() override;
  absl::Status health() const override;
  void Abort(const absl::Status& reason) override;

 private:
  struct Impl;
  explicit NcclCommunicator(std::unique_ptr<Impl> impl, const NcclOptions& o);
  absl::Status Precheck(const char* op, void* stream) const;
  absl::Status Fail(absl::Status s);
  // With op_mu_ held: Fail, then ncclCommAbort.
  absl::Status FailLocked(absl::Status s);
  void AbortLocked();

  std::unique_ptr<Impl> impl_;
  const int rank_, world_size_;
  const std::chrono::milliseconds op_timeout_;
  std::mutex op_mu_;
  mutable std::mutex state_mu_;
  absl::Status broken_;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace dsv4
