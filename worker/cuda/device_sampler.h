// DeviceSampler: the GPU worker's sampling on the device (kernels/cuda/sampling.h), one room of
// its step. Owns what the sampling keeps between steps: each slot's last sampled token (fed to the
// next step's embedding for a deferred token) and, for requests that use penalties, per-slot token
// counts [slots, vocab] allocated on first use. Not thread-safe: one engine thread.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/sampling.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/device_memory.h"

namespace dsv4 {

class DeviceSampler {
 public:
  // The slot-token table on `backend` (which reads it for deferred tokens), zeroed.
  absl::Status Init(CudaBackend* backend, int32_t num_slots, int64_t vocab);
  // Allocates and zeroes the penalty counts, once.
  absl::Status EnsureCounts();
  // Applies a step's count updates (resets of `n_reset` slots, then `n` tokens, each of a slot
  // and whether it is an output), all on the device.
  absl::Status UpdateCounts(const int32_t* reset, int64_t n_reset, const int32_t* rows,
                            const int32_t* tokens, const uint8_t* outputs, int64_t n);
  // Samples `rows` rows of `logits` [rows, vocab] with `params` and the min-tokens mask ids into
  // `outs` (device), leaving each row's token in its slot.
  absl::Status Sample(const float* logits, int64_t rows, const cuda::SampleRow* params,
                      const int32_t* mask, cuda::SampleOut* outs);
  // Copies `rows` results from the device to the host: with a kernel into mapped pinned memory
  // (`host_mapped`, the device's address of `host`), else with the copy engine.
  absl::Status CopyOut(const void* outs, int64_t rows, void* host_mapped, void* host);

  // What a captured graph bakes in (its addresses must not move between capture and replay).
  const int32_t* seen() const { return static_cast<const int32_t*>(seen_.get()); }
  const int32_t* outputs() const { return static_cast<const int32_t*>(outputs_.get()); }
  // Releases the device memory (Worker::Shutdown).
  void Release();

 private:
  CudaBackend* backend_ = nullptr;
  int32_t num_slots_ = 0;
  int64_t vocab_ = 0;
  DeviceBuffer seen_, outputs_;  // [slots, vocab] int32, allocated on first penalty use
  DeviceBuffer slot_tokens_;     // [slots] int32: each slot's last sampled token
};

}  // namespace dsv4
