// The data plane among the ranks of one tensor/expert-parallel group (architecture.md §1-§2):
// one interface, a Gloo implementation for CPU ranks (gloo_communicator.h) and, later, an NCCL one
// for GPU ranks.
//
// Contract shared by every implementation:
//  * Collectives are called by every rank of the group in the same order with the same count,
//    dtype and root. One call at a time per communicator (calls from several threads are
//    serialised, never interleaved).
//  * Buffers live in memory_space(): host memory for Gloo, device memory for NCCL. `stream` is the
//    CUDA stream (cudaStream_t as void*) a device implementation enqueues on, so that the
//    collective is stream-ordered and can be captured in a CUDA graph; host implementations are
//    synchronous and take nullptr. A device implementation may return before the data has moved
//    (errors that surface later are reported by the next call and by health()).
//  * count == 0 is a no-op that still validates its arguments.
//  * Errors come back as absl::Status naming the op, the rank and, where known, the peer; a dead
//    or stalled peer gives DEADLINE_EXCEEDED or UNAVAILABLE within the communicator's timeout,
//    never a hang. After an error the communicator is broken: every later call returns that first
//    error (FAILED_PRECONDITION); the group must be formed again.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace dsv4 {

enum class MemorySpace { kHost, kDevice };

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual MemorySpace memory_space() const = 0;
  // "gloo", "nccl": for logs and metrics.
  virtual std::string backend_name() const = 0;

  // recv[i] = sum over ranks of send[i], on every rank. send == recv is allowed (in place).
  // dtype: kF32 or kBF16 (bf16 adds in fp32 and rounds each partial sum to bf16).
  virtual absl::Status AllReduceSum(const void* send, void* recv, size_t count, DType dtype,
                                    void* stream) = 0;
  // recv = concatenation of every rank's `count` elements, rank 0 first (recv holds
  // count * world_size()). send == recv + rank() * count is allowed (in place). Any dtype.
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                                 void* stream) = 0;
  // Every rank's buf gets root's `count` elements. Any dtype.
  virtual absl::Status Broadcast(void* buf, size_t count, DType dtype, int root, void* stream) = 0;
  // Returns once every rank has entered the barrier (host-synchronous on every backend).
  virtual absl::Status Barrier() = 0;

  // OK, or the first error the communicator met (it is then broken).
  virtual absl::Status health() const = 0;
  // Marks the communicator broken (e.g. the control plane lost a peer): later calls fail at once.
  // Callable from any thread. Device implementations also abort work in flight; Gloo's calls in
  // flight end at their timeout.
  virtual void Abort(const absl::Status& reason) = 0;

 protected:
  Communicator() = default;
};

}  // namespace dsv4
