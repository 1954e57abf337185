// RAII owners of CUDA resources used by the GPU worker: device buffers, pinned host buffers,
// streams, events and instantiated graphs. Move-only; destructors log (never throw) on failure.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/cuda_check.h"

namespace dsv4 {

template <cudaError_t (*Free)(void*)>
class CudaPtr {
 public:
  CudaPtr() = default;
  CudaPtr(void* p, size_t bytes) : p_(p), bytes_(bytes) {}
  CudaPtr(CudaPtr&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  CudaPtr& operator=(CudaPtr&& o) noexcept {
    if (this != &o) {
      Reset();
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  CudaPtr(const CudaPtr&) = delete;
  CudaPtr& operator=(const CudaPtr&) = delete;
  ~CudaPtr() { Reset(); }

  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }
  void Reset() {
    if (p_ != nullptr) CUDA_LOG_IF_ERROR(Free(p_));
    p_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = CudaPtr<cudaFree>;
using PinnedBuffer = CudaPtr<cudaFreeHost>;

inline absl::StatusOr<DeviceBuffer> AllocDevice(size_t bytes) {
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  return DeviceBuffer(p, bytes);
}

inline absl::StatusOr<PinnedBuffer> AllocPinned(size_t bytes) {
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes == 0 ? 1 : bytes));
  return PinnedBuffer(p, bytes);
}

class CudaStream {
 public:
  static absl::StatusOr<CudaStream> Create() {
    CudaStream s;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking));
    return s;
  }
  CudaStream() = default;
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~CudaStream() {
    if (s_ != nullptr) CUDA_LOG_IF_ERROR(cudaStreamDestroy(s_));
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  static absl::StatusOr<CudaEvent> Create(unsigned flags = cudaEventDefault) {
    CudaEvent e;
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.e_, flags));
    return e;
  }
  CudaEvent() = default;
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~CudaEvent() {
    if (e_ != nullptr) CUDA_LOG_IF_ERROR(cudaEventDestroy(e_));
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// An instantiated CUDA graph. Empty (nothing to launch) when the captured graph had no nodes.
class CudaGraphExec {
 public:
  CudaGraphExec() = default;
  CudaGraphExec(CudaGraphExec&& o) noexcept
      : g_(std::exchange(o.g_, nullptr)), graph_(std::exchange(o.graph_, nullptr)) {}
  CudaGraphExec& operator=(CudaGraphExec&& o) noexcept {
    std::swap(g_, o.g_);
    std::swap(graph_, o.graph_);
    return *this;
  }
  ~CudaGraphExec() {
    if (g_ != nullptr) CUDA_LOG_IF_ERROR(cudaGraphExecDestroy(g_));
    if (graph_ != nullptr) CUDA_LOG_IF_ERROR(cudaGraphDestroy(graph_));
  }
  // Ends the capture on `stream` and instantiates what was captured. `keep_graph`: the captured
  // graph stays alive with the executable, so that its nodes can be updated (SinkNode).
  static absl::StatusOr<CudaGraphExec> EndCapture(cudaStream_t stream, bool keep_graph = false) {
    cudaGraph_t graph = nullptr;
    CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream, &graph));
    CudaGraphExec e;
    size_t nodes = 0;
    cudaError_t err = cudaGraphGetNodes(graph, nullptr, &nodes);
    if (err == cudaSuccess && nodes > 0) err = cudaGraphInstantiate(&e.g_, graph, 0);
    if (keep_graph && err == cudaSuccess) {
      e.graph_ = graph;
    } else {
      CUDA_LOG_IF_ERROR(cudaGraphDestroy(graph));
    }
    CUDA_RETURN_IF_ERROR(err);
    return e;
  }
  // The captured graph's only node without dependents (null when there is not exactly one, or
  // the graph was not kept).
  cudaGraphNode_t SinkNode() const {
    if (graph_ == nullptr) return nullptr;
    auto failed = [] {
      (void)cudaGetLastError();  // not left for the next launch check
      return static_cast<cudaGraphNode_t>(nullptr);
    };
    size_t n = 0;
    if (cudaGraphGetNodes(graph_, nullptr, &n) != cudaSuccess) return failed();
    if (n == 0) return nullptr;
    std::vector<cudaGraphNode_t> nodes(n);
    if (cudaGraphGetNodes(graph_, nodes.data(), &n) != cudaSuccess) return failed();
    cudaGraphNode_t sink = nullptr;
    for (cudaGraphNode_t node : nodes) {
      size_t dependents = 0;
      if (cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &dependents) != cudaSuccess) {
        return failed();
      }
      if (dependents > 0) continue;
      if (sink != nullptr) return nullptr;
      sink = node;
    }
    return sink;
  }
  absl::Status Launch(cudaStream_t stream) const {
    if (g_ != nullptr) CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g_, stream));
    return absl::OkStatus();
  }
  bool empty() const { return g_ == nullptr; }
  cudaGraphExec_t get() const { return g_; }

 private:
  cudaGraphExec_t g_ = nullptr;
  cudaGraph_t graph_ = nullptr;
};

}  // namespace dsv4
