// CudaBackend: the Backend op seam on one GPU. Weights, pools and scratch live in device memory;
// every op is an asynchronous launch on the backend's stream (kernels/cuda/*), GEMMs go through
// cuBLASLt. Big matrices are stored in bf16 by default (fp32 with DType::kF32 for exact checks);
// activations, norms, mHC and state pools are fp32.
//
// Per-step metadata (token ids, positions, block tables, ...) is packed on the host into a pinned
// staging buffer and copied with one transfer into a persistent device buffer whose address stays
// fixed while its capacity suffices (what captured graphs need). The host also derives the
// indexer's launch choice: when no token can see more than top-k compressed entries and scoring is
// not forced, the select-all kernel runs alone (the short-context shortcut); forced scoring always
// launches the scorer.
//
// Not thread-safe; the device is made current on the calling thread in BeginStep().
#pragma once

#include <memory>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "kernels/ragged_batch.h"
#include "worker/cuda/device_memory.h"
#include "worker/model/backend.h"

namespace dsv4 {

struct CudaBackendOptions {
  int device = 0;
  DType matrix_dtype = DType::kBF16;  // kBF16 or kF32
  size_t scratch_block_bytes = 256ull << 20;
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
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
  absl::Status Route(const RouterParams& p, const Tensor& logits, const Tensor& bias,
                     const Tensor& tid2eid, Tensor idx, Tensor weights) override;
  absl::Status MoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                          const Tensor& gate_up, const Tensor& down, float swiglu_limit,
                          Tensor out) override;
  absl::Status SwiGlu(const Tensor& gate_up, float limit, Tensor h) override;

  cudaStream_t stream() const { return stream_.get(); }
  int device() const { return options_.device; }
  DType matrix_dtype() const { return options_.matrix_dtype; }
  size_t persistent_bytes() const { return persistent_bytes_; }
  // The current step's metadata as device pointers.
  const RaggedBatchView& view() const { return view_; }
  // Copies host data into device memory on the stream (pinned staging not required); waits.
  absl::Status Upload(const void* src, void* dst, size_t bytes);

 private:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}
  absl::StatusOr<Tensor> AllocPersistent(DType dtype, Shape shape);
  absl::StatusOr<const void*> MatrixOperand(const Tensor& x, const Tensor& w);
  absl::StatusOr<Tensor> HcMix(const Tensor& hs, const Tensor& fn);

  CudaBackendOptions options_;
  CudaStream stream_;
  CudaEvent meta_copied_;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::vector<DeviceBuffer> persistent_;
  size_t persistent_bytes_ = 0;
  std::vector<DeviceBuffer> scratch_;
  size_t scratch_block_ = 0, scratch_offset_ = 0;
  DeviceBuffer meta_dev_;
  PinnedBuffer meta_host_;
  RaggedBatchView view_;
  const int32_t* logit_rows_ = nullptr;
  int32_t num_logit_rows_ = 0;
  int32_t max_position_ = -1;
};

}  // namespace dsv4
