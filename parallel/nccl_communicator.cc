#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/common/cuda_check.h"

namespace dsv4 {
namespace {

absl::Status NcclError(const char* op, ncclResult_t r, int rank) {
  return absl::InternalError(absl::StrCat("nccl ", op, " on rank ", rank, ": ",
                                          ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")"));
}

absl::StatusOr<ncclDataType_t> NcclType(DType d, bool sum) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32:
      if (!sum) return ncclInt32;
      break;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("nccl: dtype ", AV(DTypeName(d)),
                                                 sum ? " cannot be summed" : " is not supported"));
}

size_t Elem(DType d) { return d == DType::kBF16 ? 2 : 4; }

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  int device = 0;
  bool aborted = false;             // ncclCommAbort ran: comm is gone (under op_mu_)
  std::atomic<bool> stop_waiting{false};  // Abort() from another thread
  // Waits while `comm` reports ncclInProgress (non-blocking mode), up to `timeout` or an Abort.
  absl::Status Settle(const char* op, ncclResult_t r, int rank, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (r == ncclInProgress) {
      if (stop_waiting.load()) {
        return absl::UnavailableError(absl::StrCat("nccl ", op, " on rank ", rank, ": aborted"));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("nccl ", op, " on rank ", rank,
                                                        " did not complete within ",
                                                        timeout.count(), " ms (a missing peer?)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclCommGetAsyncError(comm, &r);
    }
    if (r != ncclSuccess) return NcclError(op, r, rank);
    return absl::OkStatus();
  }
};

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclError("GetUniqueId", r, 0);
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(const NcclOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: rank ", o.rank, " of ", o.world_size));
  }
  ncclUniqueId id;
  if (o.unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: the unique id has ", o.unique_id.size(),
                                                   " bytes; expected ", sizeof(id.internal)));
  }
  std::memcpy(id.internal, o.unique_id.data(), sizeof(id.internal));
  auto impl = std::make_unique<Impl>();
  impl->device = o.device;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, o.world_size, id, o.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) return NcclError("CommInitRankConfig", r, o.rank);
  if (absl::Status s = impl->Settle("CommInitRankConfig", r, o.rank, o.init_timeout); !s.ok()) {
    ncclCommAbort(impl->comm);
    return s;
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(std::move(impl), o));
  return c;
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, const NcclOptions& o)
    : impl_(std::move(impl)), rank_(o.rank), world_size_(o.world_size), op_timeout_(o.op_timeout) {
  // The watchdog: an asynchronous NCCL error (a peer lost mid-collective) aborts the
  // communicator, so that nothing waits on it forever. It polls only between calls.
  watchdog_ = std::thread([this] {
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::unique_lock<std::mutex> lock(op_mu_, std::try_to_lock);
      if (!lock.owns_lock() || impl_->aborted) continue;
      ncclResult_t r = ncclSuccess;
      if (ncclCommGetAsyncError(impl_->comm, &r) == ncclSuccess && r != ncclSuccess &&
          r != ncclInProgress) {
        (void)Fail(NcclError("async error", r, rank_));
        AbortLocked();
        return;
      }
    }
  });
}

void NcclCommunicator::AbortLocked() {
  if (impl_->aborted || impl_->comm == nullptr) return;
  ncclCommAbort(impl_->comm);
  impl_->aborted = true;
}

NcclCommunicator::~NcclCommunicator() {
  stop_.store(true);
  if (watchdog_.joinable()) watchdog_.join();
  std::lock_guard<std::mutex> lock(op_mu_);
  if (impl_->comm != nullptr && !impl_->aborted) {
    if (health().ok()) {
      ncclCommFinalize(impl_->comm);
      ncclResult_t r = ncclInProgress;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
        ncclCommGetAsyncError(impl_->comm, &r);
      }
      ncclCommDestroy(impl_->comm);
    } else {
      ncclCommAbort(impl_->comm);
    }
  }
}

absl::Status NcclCommunicator::health() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return broken_;
}

absl::Status NcclCommunicator::Fail(absl::Status s) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (broken_.ok()) broken_ = s;
  return s;
}

void NcclCommunicator::Abort(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (broken_.ok()) {
      broken_ = absl::UnavailableError(absl::StrCat("nccl communicator aborted: ", reason.message()));
    }
  }
  // A call waiting on the communicator stops waiting and aborts it on its way out; with none in
  // flight it is aborted here (ncclCommAbort also ends the kernels it enqueued).
  impl_->stop_waiting.store(true);
  std::unique_lock<std::mutex> lock(op_mu_, std::try_to_lock);
  if (lock.owns_lock()) AbortLocked();
}

absl::Status NcclCommunicator::FailLocked(absl::Status s) {
  (void)Fail(s);
  AbortLocked();
  return s;
}

absl::Status NcclCommunicator::Precheck(const char* op, void* stream) const {
  if (absl::Status h = health(); !h.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("nccl ", op, " on a broken communicator: ",
                                                      h.message()));
  }
  if (stream == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("nccl ", op, ": needs the CUDA stream"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllReduceSum(const void* send, void* recv, size_t count, DType dtype,
                                            void* stream) {
  RETURN_IF_ERROR(Precheck("AllReduceSum", stream));
  ASSIGN_OR_RETURN(const ncclDataType_t t, NcclType(dtype, true));
  if (count == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(op_mu_);
  if (impl_->aborted) return Precheck("AllReduceSum", stream);
  const ncclResult_t r = ncclAllReduce(send, recv, count, t, ncclSum, impl_->comm,
                                       static_cast<cudaStream_t>(stream));
  if (r != ncclSuccess && r != ncclInProgress) return FailLocked(NcclError("AllReduce", r, rank_));
  if (absl::Status s = impl_->Settle("AllReduce", r, rank_, op_timeout_); !s.ok()) return FailLocked(s);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t count, DType dtype,
                                         void* stream) {
  RETURN_IF_ERROR(Precheck("AllGather", stream));
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kI32) {
    return absl::InvalidArgumentError("nccl AllGather: f32, bf16 or i32");
  }
  if (count == 0) return absl::OkStatus();
  // Bytes: any dtype of those sizes gathers the same.
  std::lock_guard<std::mutex> lock(op_mu_);
  if (impl_->aborted) return Precheck("AllGather", stream);
  const ncclResult_t r = ncclAllGather(send, recv, count * Elem(dtype), ncclUint8, impl_->comm,
                                       static_cast<cudaStream_t>(stream));
  if (r != ncclSuccess && r != ncclInProgress) return FailLocked(NcclError("AllGather", r, rank_));
  if (absl::Status s = impl_->Settle("AllGather", r, rank_, op_timeout_); !s.ok()) return FailLocked(s);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Broadcast(void* buf, size_t count, DType dtype, int root,
                                         void* stream) {
  RETURN_IF_ERROR(Precheck("Broadcast", stream));
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("nccl Broadcast: root ", root, " of ", world_size_));
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kI32) {
    return absl::InvalidArgumentError("nccl Broadcast: f32, bf16 or i32");
  }
  if (count == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(op_mu_);
  if (impl_->aborted) return Precheck("Broadcast", stream);
  const ncclResult_t r = ncclBroadcast(buf, buf, count * Elem(dtype), ncclUint8, root, impl_->comm,
                                       static_cast<cudaStream_t>(stream));
  if (r != ncclSuccess && r != ncclInProgress) return FailLocked(NcclError("Broadcast", r, rank_));
  if (absl::Status s = impl_->Settle("Broadcast", r, rank_, op_timeout_); !s.ok()) return FailLocked(s);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Barrier() {
  RETURN_IF_ERROR(Precheck("Barrier", reinterpret_cast<void*>(1)));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(impl_->device));
  cudaStream_t st = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  float* one = nullptr;
  absl::Status s;
  if (cudaMalloc(&one, sizeof(float)) != cudaSuccess) {
    s = absl::ResourceExhaustedError("nccl Barrier: cudaMalloc");
  } else {
    s = AllReduceSum(one, one, 1, DType::kF32, st);
    if (s.ok() && cudaStreamSynchronize(st) != cudaSuccess) s = absl::InternalError("nccl Barrier: sync");
    cudaFree(one);
  }
  cudaStreamDestroy(st);
  return s;
}

}  // namespace dsv4
