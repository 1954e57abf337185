// CpuBackend: the fp32 reference implementation of the Backend op seam. Every op calls the CPU
// reference in kernels/*_ref; GEMMs go through OpenBLAS. This is the oracle for the CUDA backend.
// Owns all of its memory (host). Not thread-safe.
#pragma once

#include <memory>
#include <vector>

#include "kernels/ragged_batch.h"
#include "worker/model/backend.h"

namespace dsv4 {

class CpuBackend : public Backend {
 public:
  // `comm` (not owned; may be null): the tensor-parallel group this rank belongs to, a host
  // communicator (Gloo) whose rank and size the model's ParallelLayout must match.
  explicit CpuBackend(Communicator* comm = nullptr);
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  absl::StatusOr<Tensor> CreateWeight(const HostTensor& src, WeightUse use) override;
  absl::StatusOr<Tensor> CreateSyntheticWeight(const SyntheticSpec& spec, WeightUse use) override;
  absl::StatusOr<Tensor> CreatePool(DType dtype, Shape shape) override;
  absl::StatusOr<Tensor> Scratch(DType dtype, Shape shape) override;
  absl::Status BeginStep(const StepMeta& meta) override;
  absl::Status CopyToHost(const Tensor& src, void* dst) override;
  absl::Status CopyFromHost(const void* src, Tensor dst) override;

  absl::Status Embed(const Tensor& table, Tensor out) override;
  absl::Status Linear(const Tensor& x, const Tensor& w, Tensor y) override;
  absl::Status GroupedLinear(const Tensor& x, const Tensor& w, int64_t groups, Tensor y) override;
  absl::Status RmsNorm(const Tensor& x, const Tensor& weight, const RmsNormParams& p,
                       Tensor y) override;
  absl::Status Rope(Tensor x, const RopeParams& p) override;
  absl::Status Add(const Tensor& a, const Tensor& b, Tensor out) override;
  absl::Status GatherLogitRows(const Tensor& x, Tensor out) override;
  absl::Status HcExpand(const Tensor& x, Tensor hs) override;
  absl::Status HcPre(const Tensor& hs, const Tensor& fn, const Tensor& base, const Tensor& scale,
                     const HcParams& p, Tensor collapsed, Tensor post, Tensor comb) override;
  absl::Status HcPost(const Tensor& hs, const Tensor& f, const Tensor& post, const Tensor& comb,
                      Tensor out) override;
  absl::Status HcHead(const Tensor& hs, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const HcParams& p, Tensor y) override;
  absl::Status Compress(const CompressParams& p, const Tensor& a, const Tensor& z, Tensor state,
                        Tensor entries) override;
  absl::Status IndexerTopK(const IndexerParams& p, const Tensor& q, const Tensor& weights,
                           const Tensor& keys, Tensor out) override;
  absl::Status Attention(const AttentionParams& p, const Tensor& q, const Tensor& kv,
                         const Tensor& ring, const Tensor& entries, const Tensor& selected,
                         const Tensor& sinks, Tensor out) override;
  absl::Status RingWrite(const Tensor& kv, Tensor ring) override;
  absl::Status RingSnapshot(const Tensor& kv, Tensor ring) override;
  absl::Status CompressSnapshot(const CompressParams& p, const Tensor& a, const Tensor& z,
                                Tensor state) override;
  absl::Status CopyStateRows(std::span<const Tensor> pools,
                             std::span<const std::pair<int32_t, int32_t>> copies) override;
  absl::Status Route(const RouterParams& p, const Tensor& logits, const Tensor& bias,
                     const Tensor& tid2eid, Tensor idx, Tensor weights) override;
  absl::Status MoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                          const MoeWeights& w, float swiglu_limit, Tensor out) override;
  absl::Status SwiGlu(const Tensor& gate_up, float limit, Tensor h) override;
  absl::Status SupportsTensorParallel(const ParallelLayout& layout) const override;
  absl::Status AllReduceSum(Tensor x) override;
  absl::Status AttachCommunicator(Communicator* comm) override {
    comm_ = comm;
    return absl::OkStatus();
  }

  // Seconds spent in AllReduceSum since the last call.
  double TakeCollectiveSeconds() {
    const double s = collective_seconds_;
    collective_seconds_ = 0;
    return s;
  }
  // Bytes held by weights and pools.
  size_t persistent_bytes() const { return persistent_bytes_; }

 private:
  struct Block {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
  };
  absl::StatusOr<Tensor> Allocate(std::vector<Block>* owner, DType dtype, Shape shape);

  std::vector<Block> persistent_;
  std::vector<Block> scratch_;      // arena blocks, reused every step
  size_t scratch_block_ = 0;        // current block
  size_t scratch_offset_ = 0;       // bump offset inside it
  size_t persistent_bytes_ = 0;
  Communicator* comm_ = nullptr;
  double collective_seconds_ = 0;
  const StepMeta* meta_ = nullptr;
  RaggedBatchView view_;
};

}  // namespace dsv4
