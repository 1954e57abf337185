#include "worker/cuda/cuda_backend.h"

#include <chrono>

#include "parallel/communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>
#include <iterator>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/model_config.h"
#include "worker/checkpoint/stored_weight.h"
#include "common/env.h"
#include "common/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/compressor.h"
#include "kernels/cuda/state_snapshot.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fp8_activations.h"
#include "kernels/cuda/fp8_linear.h"
#include "kernels/cuda/moe_quant.h"
#include "kernels/quant_synthetic.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/invariant_gemm.h"
#include "kernels/cuda/indexer.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/norm_rope.h"
#include "kernels/cuda/small_gemv.h"
#include "worker/model/op_checks.h"

namespace dsv4 {
namespace {

// The ops DSV4_BENCH_REPEAT_OPS may name (Linear by weight size: Small < 16 MiB, Head >= 256 MiB,
// Large between), in the bit order of CudaBackend::repeat_ops_.
enum BenchOp {
  kBenchLinearSmall,
  kBenchLinearLarge,
  kBenchLinearHead,
  kBenchGroupedLinear,
  kBenchRmsNorm,
  kBenchRope,
  kBenchRmsNormRope,
  kBenchHcPreNorm,
  kBenchHcPostPreNorm,
  kBenchHcHeadNorm,
  kBenchHcPost,
  kBenchGatherLogitRows,
  kBenchCompress,
  kBenchIndexerTopK,
  kBenchAttention,
  kBenchRingWrite,
  kBenchRoute,
  kBenchMoeExperts,
  kBenchSharedExpertUp,
  kBenchOpCount
};
// DSV4_BENCH_REPEAT_OPS's names, in BenchOp order.
constexpr std::string_view kBenchOpNames[] = {
    "LinearSmall", "LinearLarge",     "LinearHead", "GroupedLinear", "RmsNorm",
    "Rope",        "RmsNormRope",     "HcPreNorm",  "HcPostPreNorm", "HcHeadNorm",
    "HcPost",      "GatherLogitRows", "Compress",   "IndexerTopK",   "Attention",
    "RingWrite",   "Route",           "MoeExperts", "SharedExpertUp"};
static_assert(std::size(kBenchOpNames) == kBenchOpCount, "one name per BenchOp");

int LinearBenchOp(const Tensor& w) {
  const size_t bytes = w.nbytes();
  return bytes < (size_t{16} << 20)     ? kBenchLinearSmall
         : bytes >= (size_t{256} << 20) ? kBenchLinearHead
                                        : kBenchLinearLarge;
}

constexpr size_t kAlign = 256;
// Measured on H200 (bench/gpu_kernels.cc): the GEMV kernel beats cuBLASLt for one row and
// outputs up to ~2k wide (q_a 18 -> 11 us, kv 20 -> 11 us), loses beyond and for 8 rows.
constexpr int64_t kSmallGemvMaxN = 2048;
constexpr int64_t kRowGemvMaxElems = int64_t{1} << 28;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

const float* F(const Tensor& t) { return t.empty() ? nullptr : t.ptr<float>(); }
bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Times one op while profiling (see OpProfile); the key is the op and its shapes.
class ProfileScope {
 public:
  ProfileScope(OpProfile* p, cudaStream_t s, std::string_view op, const Tensor& a,
               const Tensor& b = Tensor{})
      : p_(p), s_(s) {
    if (p_ == nullptr) return;
    std::string key(op);
    for (const Tensor* t : {&a, &b}) {
      if (!t->empty()) absl::StrAppend(&key, " ", t->shape.ToString());
    }
    p_->Begin(std::move(key), s_);
  }
  ~ProfileScope() {
    if (p_ != nullptr) p_->End(s_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  OpProfile* p_;
  cudaStream_t s_;
};
const int32_t* I(const Tensor& t) { return t.empty() ? nullptr : t.ptr<int32_t>(); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  if (options.matrix_dtype != DType::kBF16 && options.matrix_dtype != DType::kF32) {
    return absl::InvalidArgumentError("cuda backend: matrix precision must be bf16 or fp32");
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(options));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  ASSIGN_OR_RETURN(b->stream_, CudaStream::Create());
  ASSIGN_OR_RETURN(const bool two_sides, EnvBool("DSV4_TWO_SIDE_STREAMS", true));
  b->side_lanes_ = two_sides ? kSideLanes : 1;
  for (int i = 0; i < b->side_lanes_; ++i) {  // (lanes past side_lanes_ are never used)
    ASSIGN_OR_RETURN(b->side_[i], CudaStream::Create());
    ASSIGN_OR_RETURN(b->side_done_[i], CudaEvent::Create(cudaEventDisableTiming));
    ASSIGN_OR_RETURN(b->side_gemm_[i], cuda::Gemm::Create());
  }
  ASSIGN_OR_RETURN(b->side_fork_, CudaEvent::Create(cudaEventDisableTiming));
  ASSIGN_OR_RETURN(b->gates_stream_, CudaStream::Create());
  ASSIGN_OR_RETURN(b->gates_fork_, CudaEvent::Create(cudaEventDisableTiming));
  ASSIGN_OR_RETURN(b->gates_done_, CudaEvent::Create(cudaEventDisableTiming));
  ASSIGN_OR_RETURN(b->meta_copied_, CudaEvent::Create(cudaEventDisableTiming));
  ASSIGN_OR_RETURN(b->gemm_, cuda::Gemm::Create());
  ASSIGN_OR_RETURN(const bool profile, EnvBool("DSV4_PROFILE_OPS", false));
  if (profile) {
    ASSIGN_OR_RETURN(b->profile_, OpProfile::Create());
  }
  // DSV4_ROW_GEMV=0: single-token products take the general paths (the benchmark's baseline).
  ASSIGN_OR_RETURN(b->row_gemv_, EnvBool("DSV4_ROW_GEMV", true));
  // Batch-invariant mode: no single-row kernels (their sums are not the GEMM's).
  b->row_gemv_ = b->row_gemv_ && !options.batch_invariant;
  // DSV4_PDL=0: no programmatic dependent launch (read by the launchers; checked here so that a
  // bad value is an error, not a silent "on").
  RETURN_IF_ERROR(EnvBool("DSV4_PDL", true).status());
  // DSV4_HC_CLUSTER=0: decode boundaries in two kernels (the A/B baseline of the cluster launch).
  ASSIGN_OR_RETURN(b->hc_cluster_, EnvBool("DSV4_HC_CLUSTER", true));
  // DSV4_HC_STAGED=0: the prefill-sized mHC mix and norm kernels without their cp.async
  // pipelines (the A/B baseline; the same bits either way, cuda/mhc.h).
  ASSIGN_OR_RETURN(b->hc_staged_, EnvBool("DSV4_HC_STAGED", true));
  b->hc_cluster_ = b->hc_cluster_ && cuda::HcClusterSchedulable();
  // DSV4_MOE_WIDE=0: every expert streams its weights once per 8 of its tokens (the A/B baseline
  // of the wide pass, which reads them once per 64).
  ASSIGN_OR_RETURN(b->moe_kernels_.wide, EnvBool("DSV4_MOE_WIDE", true));
  // DSV4_MOE_TILED: the tiled grouped GEMMs of prefill-sized steps: 0 off (the A/B baseline),
  // 1 by shape, 64 / 128 token rows per tile forced (kernels/cuda/moe_tiled.h).
  {
    static constexpr int kTiled[] = {0, 1, 64, 128};
    ASSIGN_OR_RETURN(const int i, EnvChoice("DSV4_MOE_TILED", {"0", "1", "64", "128"}, 1));
    b->moe_kernels_.tiled = kTiled[i];
    // DSV4_MOE_TILE_WARPS: 8 (default) or 4 warps a tiled block (wider warp tiles).
    ASSIGN_OR_RETURN(const int w, EnvChoice("DSV4_MOE_TILE_WARPS", {"8", "4"}, 0));
    b->moe_kernels_.tile_warps = w == 0 ? 8 : 4;
    // DSV4_MOE_WGMMA=0: the mma.sync tiled kernels (the A/B baseline of the wgmma ones).
    ASSIGN_OR_RETURN(b->moe_kernels_.tile_wgmma, EnvBool("DSV4_MOE_WGMMA", true));
    // DSV4_MOE_WS=1: the warp-specialised tiled kernels (moe_tiled_ws.cu) instead of the wgmma
    // ones (an experiment, off: bench/results/2026-12-07-ws-experts).
    ASSIGN_OR_RETURN(b->moe_kernels_.tile_ws, EnvBool("DSV4_MOE_WS", false));
  }
  // DSV4_MOE_STREAM: the weight-streaming MXFP4 expert kernels of steps below the tiled GEMMs'
  // (kernels/cuda/moe_stream.h): 0 off (the wide kernel, the A/B baseline), 1 by shape, 2
  // wherever the shapes fit.
  {
    ASSIGN_OR_RETURN(const int i, EnvChoice("DSV4_MOE_STREAM", {"0", "1", "2"}, 1));
    b->moe_kernels_.stream = i;
    // DSV4_MOE_STREAM_WGMMA=0: their products on mma.sync (the wgmma ones' baseline).
    ASSIGN_OR_RETURN(b->moe_kernels_.stream_wgmma, EnvBool("DSV4_MOE_STREAM_WGMMA", true));
  }
  // Precision fp8: the FP8 products of prefill-sized steps on FP8 tensor cores with e4m3
  // activations (the options say; a decision of the coordinator's, equal on every rank).
  if (options.fp8_activations &&
      (options.batch_invariant || options.matrix_dtype != DType::kBF16)) {
    return absl::InvalidArgumentError(
        "precision fp8 needs bf16 matrices and does not combine with batch_invariant");
  }
  // DSV4_FP8_ACTIVATION_ROWS=all (tests and experiments): every FP8 product past the GEMV's rows.
  {
    ASSIGN_OR_RETURN(const int i, EnvChoice("DSV4_FP8_ACTIVATION_ROWS", {"128", "all"}, 0));
    const int64_t rows = i == 0 ? kFp8ActivationRows : cuda::kFp8GemvMaxRows + 1;
    b->fp8_prefill_rows_ = options.fp8_activations ? rows : 0;
  }
  // DSV4_INDEXER_TF32=0: the indexer scores with fp32 FMAs in bf16 mode too (the A/B baseline of
  // the TF32 tensor-core scoring; fp32 mode always takes them, the reference's order).
  ASSIGN_OR_RETURN(b->indexer_tf32_, EnvBool("DSV4_INDEXER_TF32", true));
  b->indexer_tf32_ = b->indexer_tf32_ && options.matrix_dtype == DType::kBF16;
  // Batch-invariant mode: the grouped FMA GEMV, whose sums do not depend on the token count.
  b->moe_kernels_.tensor_cores = !options.batch_invariant;
  // DSV4_MOE_FP8=1 (precision fp8 only; an experiment, off: slower than the bf16 expansion so
  // far, bench/results/2026-12-03-wgmma-experts): MXFP4 experts of tiled steps on FP8 tensor
  // cores with e4m3 activations (kernels/cuda/moe_tiled_fp8.cu).
  ASSIGN_OR_RETURN(const bool moe_fp8, EnvBool("DSV4_MOE_FP8", false));
  b->moe_kernels_.fp8_activations = options.fp8_activations && moe_fp8;
  // DSV4_HC_DEFER_GATES=0: the boundary kernel computes post and comb itself (the Sinkhorn on
  // the critical path, the A/B baseline of the deferral).
  ASSIGN_OR_RETURN(b->defer_gates_, EnvBool("DSV4_HC_DEFER_GATES", true));
  ASSIGN_OR_RETURN(b->repeat_ops_, EnvSubset("DSV4_BENCH_REPEAT_OPS", kBenchOpNames));
  return b;
}

CudaBackend::~CudaBackend() {
  ProfileRelease();
  for (const CudaStream& side : side_) {
    if (side.get() != nullptr) CUDA_LOG_IF_ERROR(cudaStreamSynchronize(side.get()));
  }
  if (gates_stream_.get() != nullptr) CUDA_LOG_IF_ERROR(cudaStreamSynchronize(gates_stream_.get()));
  if (stream_.get() != nullptr) CUDA_LOG_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  if (profile_) std::fputs(profile_->Report().c_str(), stderr);
  if (scratch_high_ > 0) {
    std::fprintf(stderr,
                 "cuda backend: step scratch high water %.1f MiB (a step of %d tokens); the "
                 "arenas hold %.1f MiB\n",
                 scratch_high_ / 1048576.0, scratch_high_tokens_,
                 (model_arena_.held() + op_arena_.held()) / 1048576.0);
  }
}

size_t CudaBackend::Arena::used() const {
  size_t bytes = offset;
  for (size_t i = 0; i < block && i < blocks.size(); ++i) bytes += blocks[i].bytes();
  return bytes;
}

size_t CudaBackend::Arena::held() const {
  size_t bytes = 0;
  for (const DeviceBuffer& b : blocks) bytes += b.bytes();
  return bytes;
}

absl::StatusOr<Tensor> CudaBackend::AllocPersistent(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  for (int i = 0; i < shape.rank; ++i) {
    if (shape[i] < 0) return absl::InvalidArgumentError("negative dimension");
  }
  ASSIGN_OR_RETURN(DeviceBuffer buf, AllocDevice(t.nbytes()));
  t.data = buf.get();
  persistent_bytes_ += t.nbytes();
  persistent_.push_back(std::move(buf));
  return t;
}

absl::Status CudaBackend::Upload(const void* src, void* dst, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CudaBackend::CreateWeight(const HostTensor& src, WeightUse use) {
  if (src.dtype != DType::kF32 && src.dtype != DType::kI32) {
    return absl::InvalidArgumentError("cuda backend: host weights are f32 or i32");
  }
  const size_t have = src.dtype == DType::kI32 ? src.i32.size() : src.f32.size();
  if (have != static_cast<size_t>(src.shape.numel())) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight data has ", have, " values for shape ", src.shape.ToString()));
  }
  const bool bf16 = src.dtype == DType::kF32 && use == WeightUse::kMatrix &&
                    options_.matrix_dtype == DType::kBF16;
  ASSIGN_OR_RETURN(Tensor t, AllocPersistent(bf16 ? DType::kBF16 : src.dtype, src.shape));
  if (bf16) {
    std::vector<uint16_t> h(src.f32.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = F32ToBf16(src.f32[i]);
    RETURN_IF_ERROR(Upload(h.data(), t.data, t.nbytes()));
  } else {
    RETURN_IF_ERROR(Upload(src.data(), t.data, t.nbytes()));
  }
  return t;
}

absl::StatusOr<Tensor> CudaBackend::CreateStoredWeight(const StoredWeight& src, WeightUse use) {
  // Quantised matrices stay as stored: the e4m3 bytes or e2m1 nibbles and their scales; the
  // products dequantise in registers (kernels/cuda/fp8_linear.h, moe_quant.h).
  if (src.format == WeightFormat::kDense || use != WeightUse::kMatrix || src.shape.rank < 2) {
    return Backend::CreateStoredWeight(src, use);
  }
  const bool fp8 = src.format == WeightFormat::kFp8Block;
  Tensor t;
  t.dtype = fp8 ? DType::kF8E4M3 : DType::kI8;
  t.shape = src.shape;
  t.quant.format = fp8 ? QuantFormat::kFp8Block : QuantFormat::kMxfp4;
  t.quant.block_rows = src.block_rows;
  t.quant.block_cols = src.block_cols;
  t.quant.part_rows = src.part_rows;
  if (src.data.size() != t.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat("weight ", src.name, ": ", src.data.size(),
                                                   " bytes for ", src.shape.ToString(), " ",
                                                   AV(WeightFormatName(src.format))));
  }
  const size_t scale_bytes = fp8 ? src.scale_f32.size() * 4 : src.scale_e8m0.size();
  ASSIGN_OR_RETURN(DeviceBuffer data, AllocDevice(src.data.size()));
  ASSIGN_OR_RETURN(DeviceBuffer scale, AllocDevice(std::max<size_t>(scale_bytes, 16)));
  RETURN_IF_ERROR(Upload(src.data.data(), data.get(), src.data.size()));
  RETURN_IF_ERROR(Upload(fp8 ? static_cast<const void*>(src.scale_f32.data())
                             : static_cast<const void*>(src.scale_e8m0.data()),
                         scale.get(), scale_bytes));
  t.data = data.get();
  t.quant.scale = scale.get();
  persistent_bytes_ += src.data.size() + scale_bytes;
  persistent_.push_back(std::move(data));
  persistent_.push_back(std::move(scale));
  if (fp8) RETURN_IF_ERROR(ReserveDequant(t));
  return t;
}

absl::StatusOr<Tensor> CudaBackend::CreateSyntheticWeight(const SyntheticSpec& spec,
                                                          WeightUse use) {
  if (spec.dtype == DType::kI32) {
    if (spec.modulus < 1)
      return absl::InvalidArgumentError("synthetic index table needs modulus >= 1");
    ASSIGN_OR_RETURN(Tensor t, AllocPersistent(DType::kI32, spec.shape));
    RETURN_IF_ERROR(
        cuda::FillIndices(t.ptr<int32_t>(), t.numel(), spec.seed, spec.modulus, stream_.get()));
    return t;
  }
  if (spec.dtype != DType::kF32)
    return absl::InvalidArgumentError("synthetic weights are f32 or i32");
  if (spec.format != QuantFormat::kNone && use == WeightUse::kMatrix && spec.shape.rank >= 2) {
    return CreateSyntheticQuantized(spec);
  }
  const DType dtype = use == WeightUse::kMatrix ? options_.matrix_dtype : DType::kF32;
  ASSIGN_OR_RETURN(Tensor t, AllocPersistent(dtype, spec.shape));
  RETURN_IF_ERROR(
      cuda::FillUniform(t.data, dtype, t.numel(), spec.seed, spec.lo, spec.hi, stream_.get()));
  return t;
}

// A synthetic matrix in a released format, filled on the device (kernels/quant_synthetic.h: the
// bytes the CPU reference builds on the host).
absl::StatusOr<Tensor> CudaBackend::CreateSyntheticQuantized(const SyntheticSpec& spec) {
  const bool fp8 = spec.format == QuantFormat::kFp8Block;
  Tensor t;
  t.dtype = fp8 ? DType::kF8E4M3 : DType::kI8;
  t.shape = spec.shape;
  t.quant.format = spec.format;
  const int64_t cols = spec.shape[spec.shape.rank - 1], rows = spec.shape.numel() / cols;
  t.quant.block_rows = fp8 ? spec.block_rows : 1;
  t.quant.block_cols = fp8 ? spec.block_cols : 32;
  t.quant.part_rows = fp8 ? (spec.part_rows > 0 ? spec.part_rows : rows) : 0;
  if (!fp8 && cols % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic MXFP4 ", spec.shape.ToString(),
                                                   ": columns must be a multiple of 32"));
  }
  size_t scale_count = 0;
  if (fp8) {
    Fp8Matrix m{nullptr, nullptr, rows, cols, t.quant.block_rows, t.quant.block_cols,
                t.quant.part_rows};
    scale_count = static_cast<size_t>(m.ScaleCount());
  } else {
    scale_count = static_cast<size_t>(spec.shape.numel() / 32);
  }
  const size_t scale_bytes = scale_count * (fp8 ? 4 : 1);
  ASSIGN_OR_RETURN(DeviceBuffer data, AllocDevice(std::max<size_t>(t.nbytes(), 16)));
  ASSIGN_OR_RETURN(DeviceBuffer scale, AllocDevice(std::max<size_t>(scale_bytes, 16)));
  if (fp8) {
    const float s = SyntheticFp8Scale(spec.lo, spec.hi);
    RETURN_IF_ERROR(cuda::FillFp8Synthetic(static_cast<uint8_t*>(data.get()), spec.shape.numel(),
                                           spec.seed, spec.lo, spec.hi, s, stream_.get()));
    RETURN_IF_ERROR(cuda::FillUniform(scale.get(), DType::kF32, static_cast<int64_t>(scale_count),
                                      0, s, s, stream_.get()));
  } else {
    RETURN_IF_ERROR(cuda::FillMxfp4Synthetic(static_cast<uint8_t*>(data.get()),
                                             static_cast<uint8_t*>(scale.get()), spec.shape.numel(),
                                             spec.seed, spec.lo, spec.hi, stream_.get()));
  }
  t.data = data.get();
  t.quant.scale = scale.get();
  persistent_bytes_ += t.nbytes() + scale_bytes;
  persistent_.push_back(std::move(data));
  persistent_.push_back(std::move(scale));
  if (fp8) RETURN_IF_ERROR(ReserveDequant(t));
  return t;
}

// The shapes the compiled kernels take (kernels/cuda/*): any number of attention heads, head
// dims 64/128/256/512, indexer heads 4..64 (powers of two) with dims in multiples of 4, mHC
// streams 1..8, up to 1024 experts and top-16, widths in multiples of 8 (32 for MXFP4 experts).
absl::Status CudaBackend::Supports(const ModelConfig& c) const {
  auto no = [](const char* field, int64_t value, const char* supported) {
    return absl::UnimplementedError(absl::StrCat("config.json: ", field, " = ", value,
                                                 " is not supported by the CUDA backend (",
                                                 supported, ")"));
  };
  if (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256 &&
      c.head_dim != 512) {
    return no("head_dim", c.head_dim, "32, 64, 128, 256 or 512");
  }
  if (c.HasLayerType(AttnType::kCsa)) {
    const int64_t h = c.index_n_heads;
    if (h != 4 && h != 8 && h != 16 && h != 32 && h != 64) {
      return no("index_n_heads", h, "4, 8, 16, 32 or 64");
    }
    if (c.index_head_dim % 4 != 0) return no("index_head_dim", c.index_head_dim, "multiples of 4");
  }
  if (c.hc_mult < 1 || c.hc_mult > 8) return no("hc_mult", c.hc_mult, "1 to 8");
  if (c.n_routed_experts > 1024) return no("n_routed_experts", c.n_routed_experts, "at most 1024");
  if (c.num_experts_per_tok > 16) return no("num_experts_per_tok", c.num_experts_per_tok, "at most 16");
  if (c.hidden_size % 32 != 0) return no("hidden_size", c.hidden_size, "multiples of 32");
  if (c.moe_intermediate_size % 32 != 0) {
    return no("moe_intermediate_size", c.moe_intermediate_size, "multiples of 32");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaBackend::FreeMemoryBytes() const {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  size_t free_bytes = 0, total = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total));
  return static_cast<uint64_t>(free_bytes);
}

absl::StatusOr<Tensor> CudaBackend::CreatePool(DType dtype, Shape shape) {
  ASSIGN_OR_RETURN(Tensor t, AllocPersistent(dtype, shape));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.data, 0, t.nbytes(), stream_.get()));
  return t;
}

absl::StatusOr<Tensor> CudaBackend::Scratch(DType dtype, Shape shape) {
  return Bump(&model_arena_, dtype, shape);
}

// Blocks are never freed or moved: captured graphs keep pointing into them.
absl::StatusOr<Tensor> CudaBackend::Bump(Arena* arena, DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  const size_t bytes = AlignUp(std::max<size_t>(t.nbytes(), 1));
  while (arena->block < arena->blocks.size() &&
         arena->offset + bytes > arena->blocks[arena->block].bytes()) {
    ++arena->block;
    arena->offset = 0;
  }
  if (arena->block == arena->blocks.size()) {
    ASSIGN_OR_RETURN(DeviceBuffer block,
                     AllocDevice(std::max(options_.scratch_block_bytes, bytes)));
    arena->blocks.push_back(std::move(block));
    arena->offset = 0;
  }
  t.data = static_cast<char*>(arena->blocks[arena->block].get()) + arena->offset;
  arena->offset += bytes;
  const size_t used = model_arena_.used() + op_arena_.used();
  if (used > scratch_high_) {
    scratch_high_ = used;
    scratch_high_tokens_ = view_.num_tokens;
  }
  return t;
}

absl::Status CudaBackend::BeginStep(const StepMeta& meta) {
  // The payload set for this step (one step only, whether or not it begins).
  const void* payload_host = std::exchange(payload_host_, nullptr);
  const size_t payload_bytes = std::exchange(payload_bytes_, 0);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  if (pw_ != nullptr || eager_depth_ != 0 || on_side_ || side_pending_ != 0 || gates_pending_) {
    // A failed step left a capture, piecewise run or side region open: close it (joining the
    // side stream) so that one error does not fail every later step.
    std::fputs(
        "cuda backend: closing a graph capture, side region or gates fork left open by a "
        "failed step\n",
        stderr);
    AbortGraphs();
  }
  step_scores_ = Tensor{};
  layer_reuse_ = false;
  for (Arena* a : {&model_arena_, &op_arena_}) {
    a->block = 0;
    a->offset = 0;
  }
  const int32_t T = meta.num_tokens, S = meta.num_seqs;
  const int64_t R = static_cast<int64_t>(meta.logit_rows.size());
  if (static_cast<int64_t>(meta.token_ids.size()) != T ||
      static_cast<int64_t>(meta.seq_begin.size()) != S + 1 ||
      static_cast<int64_t>(meta.block_table.size()) !=
          static_cast<int64_t>(S) * meta.block_stride) {
    return absl::InvalidArgumentError("cuda backend: inconsistent step metadata");
  }
  // One int32 array: ids, positions, token_seq, seq_begin, start_pos, slots, block table, rows,
  // then the in-step snapshots (sequence, position, row of each).
  const int64_t K = static_cast<int64_t>(meta.snap_seq.size());
  if (static_cast<int64_t>(meta.snap_pos.size()) != K ||
      static_cast<int64_t>(meta.snap_row.size()) != K) {
    return absl::InvalidArgumentError("cuda backend: inconsistent snapshot metadata");
  }
  const int64_t words = 3 * int64_t{T} + (S + 1) + 2 * int64_t{S} +
                        static_cast<int64_t>(meta.block_table.size()) + R + 3 * K;
  // Then the caller's payload (SetStepPayload), 16-byte aligned.
  const size_t payload_at = (sizeof(int32_t) * static_cast<size_t>(words) + 15) / 16 * 16;
  const size_t bytes = payload_bytes > 0 ? payload_at + payload_bytes
                                         : sizeof(int32_t) * static_cast<size_t>(words);
  // The previous step's transfer must be done before the staging buffer is rewritten.
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(meta_copied_.get()));
  if (meta_host_.bytes() < bytes) {
    const size_t cap = std::max<size_t>(bytes * 2, 64 << 10);
    // Both buffers or neither: a failed allocation leaves the old pair in place.
    ASSIGN_OR_RETURN(PinnedBuffer host, AllocPinned(cap));
    // Kernels of earlier steps may still read the old device buffer.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    ASSIGN_OR_RETURN(DeviceBuffer dev, AllocDevice(cap));
    meta_host_ = std::move(host);
    meta_dev_ = std::move(dev);
    ++meta_generation_;  // graphs captured against the old buffer must be captured again
  }
  auto* host = static_cast<int32_t*>(meta_host_.get());
  auto* dev = static_cast<int32_t*>(meta_dev_.get());
  int64_t off = 0;
  auto put = [&](const std::vector<int32_t>& v) -> const int32_t* {
    std::memcpy(host + off, v.data(), sizeof(int32_t) * v.size());
    const int32_t* d = dev + off;
    off += static_cast<int64_t>(v.size());
    return d;
  };
  view_ = RaggedBatchView{};
  view_.num_tokens = T;
  view_.num_seqs = S;
  view_.token_ids = put(meta.token_ids);
  view_.positions = put(meta.positions);
  view_.token_seq = put(meta.token_seq);
  view_.seq_begin = put(meta.seq_begin);
  view_.seq_start_pos = put(meta.seq_start_pos);
  view_.state_slot = put(meta.state_slot);
  view_.block_table = put(meta.block_table);
  view_.block_stride = meta.block_stride;
  view_.block_size = meta.block_size;
  view_.force_indexer_scoring = meta.force_indexer_scoring;
  logit_rows_ = put(meta.logit_rows);
  num_logit_rows_ = static_cast<int32_t>(R);
  view_.num_snapshots = static_cast<int32_t>(K);
  view_.snap_seq = put(meta.snap_seq);
  view_.snap_pos = put(meta.snap_pos);
  view_.snap_row = put(meta.snap_row);
  max_position_ =
      meta.positions.empty() ? -1 : *std::max_element(meta.positions.begin(), meta.positions.end());
  max_position_bound_ = meta.max_position_bound;
  payload_dev_ = nullptr;
  if (payload_bytes > 0) {
    std::memcpy(reinterpret_cast<char*>(host) + payload_at, payload_host, payload_bytes);
    payload_dev_ = reinterpret_cast<const char*>(dev) + payload_at;
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_.get()));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(meta_copied_.get(), stream_.get()));
  if (profile_) RETURN_IF_ERROR(profile_->Open(stream_.get()));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::Capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream_.get(), &status));
  return status != cudaStreamCaptureStatusNone;
}

absl::Status CudaBackend::BeginCapture() {
  // Relaxed: a first capture may still grow the scratch arenas (cudaMalloc) from this thread.
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeRelaxed));
  return absl::OkStatus();
}

absl::Status CudaBackend::BeginPiecewise(PiecewiseGraph* g, bool capture, EagerRegion region) {
  if (pw_ != nullptr) return absl::FailedPreconditionError("a piecewise step is already open");
  if (!capture && !g->captured)
    return absl::FailedPreconditionError("piecewise graph not captured");
  pw_capture_ = capture;
  pw_region_ = region;
  pw_segment_ = 0;
  eager_depth_ = 0;
  if (capture) {
    g->segments.clear();
    g->arena_marks.clear();
    g->captured = false;
    RETURN_IF_ERROR(BeginCapture());
  } else {
    skip_ = true;
  }
  pw_ = g;
  return absl::OkStatus();
}

absl::Status CudaBackend::CutSegment() {
  RETURN_IF_ERROR(JoinGates());  // a segment's capture ends with every fork joined
  const std::pair<size_t, size_t> mark{model_arena_.block, model_arena_.offset};
  if (pw_capture_) {
    ASSIGN_OR_RETURN(CudaGraphExec seg, CudaGraphExec::EndCapture(stream_.get()));
    pw_->segments.push_back(std::move(seg));
    pw_->arena_marks.push_back(mark);
  } else if (pw_segment_ >= pw_->segments.size() || pw_->arena_marks[pw_segment_] != mark) {
    // The model's scratch addresses differ from the capture's: replaying would read and write
    // the wrong memory.
    return absl::InternalError(
        absl::StrCat("piecewise replay diverged from its capture at segment ", pw_segment_));
  }
  RETURN_IF_ERROR(pw_->segments[pw_segment_].Launch(stream_.get()));
  ++pw_segment_;
  return absl::OkStatus();
}

absl::Status CudaBackend::EnterEager() {
  if (pw_ == nullptr || eager_depth_++ > 0) return absl::OkStatus();
  RETURN_IF_ERROR(JoinGates());
  if (on_side_ || side_pending_ != 0) {
    return absl::InternalError("piecewise cut inside a side region (join it first)");
  }
  skip_ = false;
  return CutSegment();
}

absl::Status CudaBackend::LeaveEager() {
  if (pw_ == nullptr || --eager_depth_ > 0) return absl::OkStatus();
  if (pw_capture_) return BeginCapture();
  skip_ = true;
  return absl::OkStatus();
}

absl::Status CudaBackend::Mark(StepMark mark) {
  switch (mark) {
    case StepMark::kSideBegin:
      // Op profiling times one stream: side work stays on the main stream then.
      if (profile_ || on_side_) return absl::OkStatus();
      CUDA_RETURN_IF_ERROR(cudaEventRecord(side_fork_.get(), stream_.get()));
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_[side_lane_].get(), side_fork_.get(), 0));
      on_side_ = true;
      return absl::OkStatus();
    case StepMark::kSideEnd:
      if (!on_side_) return absl::OkStatus();
      on_side_ = false;
      side_pending_ |= 1u << side_lane_;
      CUDA_RETURN_IF_ERROR(
          cudaEventRecord(side_done_[side_lane_].get(), side_[side_lane_].get()));
      side_lane_ = (side_lane_ + 1) % side_lanes_;
      return absl::OkStatus();
    case StepMark::kSideJoin:
      if (on_side_) return absl::InternalError("side join inside an open side region");
      return JoinSides();
    case StepMark::kLayersEnd:
      // The last boundary's post and comb are joined by the model's HcPost; a FULL capture
      // ends after the head, so no fork may outlive the layers in any case.
      RETURN_IF_ERROR(JoinGates());
      break;
    case StepMark::kLayerBegin:
    case StepMark::kLayerEnd:
      return LayerMark(mark);
    default:
      break;
  }
  if (pw_ == nullptr) return absl::OkStatus();
  switch (mark) {
    case StepMark::kAttentionBegin:
      return pw_region_ == EagerRegion::kWide ? EnterEager() : absl::OkStatus();
    case StepMark::kAttentionEnd:
      return pw_region_ == EagerRegion::kWide ? LeaveEager() : absl::OkStatus();
    case StepMark::kSideBegin:
    case StepMark::kSideEnd:
    case StepMark::kSideJoin:
    case StepMark::kLayerBegin:
    case StepMark::kLayerEnd:
      break;
    case StepMark::kLayersEnd: {
      if (eager_depth_ != 0)
        return absl::InternalError("piecewise step ended inside an eager region");
      skip_ = false;
      absl::Status st = CutSegment();
      if (st.ok() && !pw_capture_ && pw_segment_ != pw_->segments.size()) {
        st = absl::InternalError("piecewise replay ended before its last segment");
      }
      if (st.ok() && pw_capture_) pw_->captured = true;
      pw_ = nullptr;
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerMark(StepMark mark) {
  if (mark == StepMark::kLayerBegin) {
    layer_reuse_ = false;
    if (pw_ != nullptr || view_.num_tokens < kLayerReuseMinTokens) return absl::OkStatus();
    ASSIGN_OR_RETURN(const bool capturing, Capturing());
    if (capturing) return absl::OkStatus();
    layer_reuse_ = true;
    layer_mark_model_ = {model_arena_.block, model_arena_.offset};
    layer_mark_op_ = {op_arena_.block, op_arena_.offset};
    return absl::OkStatus();
  }
  if (!layer_reuse_) return absl::OkStatus();
  layer_reuse_ = false;
  if (on_side_) return absl::InternalError("layer end inside an open side region");
  // Side regions and the deferred gates may still read this layer's scratch: the main stream
  // waits for them before the next layer's ops (stream-ordered after it, side forks included)
  // write there.
  RETURN_IF_ERROR(JoinSides());
  RETURN_IF_ERROR(JoinGates());
  std::tie(model_arena_.block, model_arena_.offset) = layer_mark_model_;
  std::tie(op_arena_.block, op_arena_.offset) = layer_mark_op_;
  step_scores_ = Tensor{};  // the next CSA layer takes its scores buffer again
  return absl::OkStatus();
}

absl::Status CudaBackend::JoinGates() {
  if (!gates_pending_) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), gates_done_.get(), 0));
  // (An op in an open side region runs on its side stream, forked before this join.)
  if (on_side_) CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cur_stream(), gates_done_.get(), 0));
  gates_pending_ = false;
  return absl::OkStatus();
}

absl::Status CudaBackend::DeferredGates(const cuda::HcDims& d, const Tensor& gates,
                                        const HcGateNorm& g, Tensor post, Tensor comb) {
  if (profile_ || on_side_) {
    return cuda::HcGates(d, gates.ptr<float>(), F(g.base), F(g.scale), post.ptr<float>(),
                         comb.ptr<float>(), cur_stream());
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(gates_fork_.get(), stream_.get()));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(gates_stream_.get(), gates_fork_.get(), 0));
  // Pending from here: a failed launch is still joined (JoinGates, AbortGraphs).
  gates_pending_ = true;
  RETURN_IF_ERROR(cuda::HcGates(d, gates.ptr<float>(), F(g.base), F(g.scale), post.ptr<float>(),
                                comb.ptr<float>(), gates_stream_.get()));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(gates_done_.get(), gates_stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::JoinSides() {
  RETURN_IF_ERROR(JoinGates());
  for (int i = 0; i < kSideLanes; ++i) {
    if ((side_pending_ & (1u << i)) == 0) continue;
    // (The bit stays set if the wait fails: AbortGraphs then still joins the lane.)
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), side_done_[i].get(), 0));
    side_pending_ &= ~(1u << i);
  }
  side_lane_ = 0;
  return absl::OkStatus();
}

void CudaBackend::AbortGraphs() {
  if (gates_pending_) {
    cudaEventRecord(gates_done_.get(), gates_stream_.get());
    cudaStreamWaitEvent(stream_.get(), gates_done_.get(), 0);
    cudaGetLastError();
    gates_pending_ = false;
  }
  if (on_side_ || side_pending_ != 0) {
    // Join the side streams first: nothing is left behind on them, and a capture that forked
    // onto them can end (an unjoined fork makes cudaStreamEndCapture fail).
    if (on_side_) side_pending_ |= 1u << side_lane_;
    for (int i = 0; i < kSideLanes; ++i) {
      if ((side_pending_ & (1u << i)) == 0) continue;
      cudaEventRecord(side_done_[i].get(), side_[i].get());
      cudaStreamWaitEvent(stream_.get(), side_done_[i].get(), 0);
    }
    cudaGetLastError();
  }
  on_side_ = false;
  side_pending_ = 0;
  side_lane_ = 0;
  absl::StatusOr<bool> capturing = Capturing();
  if (capturing.ok() && *capturing) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream_.get(), &g) == cudaSuccess && g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();
  }
  if (pw_ != nullptr && pw_capture_) {
    pw_->segments.clear();
    pw_->captured = false;
  }
  pw_ = nullptr;
  eager_depth_ = 0;
  skip_ = false;
}

std::vector<uintptr_t> CudaBackend::Baked(bool with_head) const {
  auto p = [](const void* x) { return reinterpret_cast<uintptr_t>(x); };
  std::vector<uintptr_t> baked = {p(view_.token_ids),
                                  p(view_.positions),
                                  p(view_.token_seq),
                                  p(view_.seq_begin),
                                  p(view_.seq_start_pos),
                                  p(view_.state_slot),
                                  p(view_.block_table),
                                  static_cast<uintptr_t>(view_.num_tokens),
                                  static_cast<uintptr_t>(view_.num_seqs),
                                  static_cast<uintptr_t>(view_.block_stride),
                                  static_cast<uintptr_t>(view_.block_size),
                                  static_cast<uintptr_t>(max_position_bound_),
                                  static_cast<uintptr_t>(view_.force_indexer_scoring),
                                  meta_generation_};
  baked.push_back(p(slot_tokens_));
  if (with_head) {
    baked.push_back(p(payload_dev_));
    baked.push_back(p(logit_rows_));
    baked.push_back(static_cast<uintptr_t>(num_logit_rows_));
  }
  return baked;
}

absl::StatusOr<int64_t> CudaBackend::LaunchMaxPosition() const {
  ASSIGN_OR_RETURN(const bool capturing, Capturing());
  if (!capturing) return max_position_;
  if (max_position_bound_ < 0) {
    return absl::FailedPreconditionError("graph capture needs StepMeta::max_position_bound");
  }
  return max_position_bound_;
}

absl::Status CudaBackend::CopyToHost(const Tensor& src, void* dst) {
  ProfileRelease();
  RETURN_IF_ERROR(JoinGates());
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_.get()));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyFromHost(const void* src, Tensor dst) {
  RETURN_IF_ERROR(JoinGates());
  return Upload(src, dst.data, dst.nbytes());
}

absl::Status CudaBackend::Embed(const Tensor& table, Tensor out) {
  RETURN_IF_ERROR(op_checks::Embed(table, out, view_.num_tokens));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "Embed", out);
  return cuda::Embed(table.data, table.dtype, table.dim(0), table.dim(1), view_, Deferred(), 1,
                     out.ptr<float>(), cur_stream());
}

absl::Status CudaBackend::EmbedExpand(const Tensor& table, Tensor hs) {
  RETURN_IF_ERROR(op_checks::EmbedExpand(table, hs, view_.num_tokens));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "EmbedExpand", hs);
  return cuda::Embed(table.data, table.dtype, table.dim(0), table.dim(1), view_, Deferred(),
                     hs.dim(1), hs.ptr<float>(), cur_stream());
}

absl::StatusOr<const void*> CudaBackend::MatrixOperand(const Tensor& x, const Tensor& w) {
  if (w.dtype == DType::kF32) return static_cast<const void*>(x.data);
  ASSIGN_OR_RETURN(Tensor xb, OpScratch(DType::kBF16, x.shape));
  RETURN_IF_ERROR(cuda::CastToBf16(x.ptr<float>(), xb.ptr<uint16_t>(), x.numel(), cur_stream()));
  return static_cast<const void*>(xb.data);
}

bool CudaBackend::UseRowGemv(const Tensor& x, const Tensor& w) const {
  return row_gemv_ && x.dim(0) == 1 && w.dtype == DType::kBF16 && w.dim(1) % 8 == 0 &&
         w.numel() <= kRowGemvMaxElems && Aligned16(x.data) && Aligned16(w.data);
}

absl::Status CudaBackend::Linear(const Tensor& x, const Tensor& w, Tensor y) {
  RETURN_IF_ERROR(op_checks::Linear(x, w, y));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "Linear", x, w);
  if (w.quantized()) return QuantLinear(x, w, 1, y);
  // One row with bf16 weights up to 256 Mi elements: the weight-streaming GEMV (it beats
  // cuBLASLt's single-row kernels there and needs no bf16 copy of x; on the 0.5 Gi-element
  // lm_head cuBLASLt streams ~4% faster). Other single-row products with narrow outputs: the
  // split-K GEMV (cuBLASLt picks few CTAs there); everything else stays with cuBLASLt. In
  // batch-invariant mode every product is cuda::InvariantGemm (RunGemm).
  if (UseRowGemv(x, w)) {
    return Launch(LinearBenchOp(w), [&] {
      return cuda::RowGemvBf16(x.ptr<float>(), w.dim(1), w.data, w.dim(0), w.dim(0), y.ptr<float>(),
                               cur_stream());
    });
  }
  if (!options_.batch_invariant && x.dim(0) == 1 && w.dim(0) <= kSmallGemvMaxN &&
      w.dim(1) % 8 == 0) {
    return Launch(LinearBenchOp(w), [&] {
      return cuda::SmallGemv(x.ptr<float>(), x.dim(0), w.dim(1), w.data, w.dtype, w.dim(0),
                             y.ptr<float>(), cur_stream());
    });
  }
  ASSIGN_OR_RETURN(const void* xin, MatrixOperand(x, w));
  cuda::GemmShape s;
  s.m = x.dim(0);
  s.n = w.dim(0);
  s.k = w.dim(1);
  s.dtype = w.dtype;
  return Launch(LinearBenchOp(w),
                [&] { return RunGemm(s, xin, w.data, y.ptr<float>()); });
}

absl::Status CudaBackend::GroupedLinear(const Tensor& x, const Tensor& w, int64_t groups,
                                        Tensor y) {
  RETURN_IF_ERROR(op_checks::GroupedLinear(x, w, groups, y));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "GroupedLinear", x, w);
  if (w.quantized()) return QuantLinear(x, w, groups, y);
  if (UseRowGemv(x, w)) {
    return Launch(kBenchGroupedLinear, [&] {
      return cuda::RowGemvBf16(x.ptr<float>(), w.dim(1), w.data, w.dim(0), w.dim(0) / groups,
                               y.ptr<float>(), cur_stream());
    });
  }
  ASSIGN_OR_RETURN(const void* xin, MatrixOperand(x, w));
  cuda::GemmShape s;
  s.m = x.dim(0);
  s.n = w.dim(0) / groups;
  s.k = w.dim(1);
  s.dtype = w.dtype;
  s.batch = groups;
  s.ldx = x.dim(1);
  s.ldy = y.dim(1);
  s.stride_x = s.k;
  s.stride_w = s.n * s.k;
  s.stride_y = s.n;
  return Launch(kBenchGroupedLinear,
                [&] { return RunGemm(s, xin, w.data, y.ptr<float>()); });
}

Fp8Matrix CudaBackend::Fp8(const Tensor& w) {
  const int64_t cols = w.dim(w.shape.rank - 1);
  return Fp8Matrix{static_cast<const uint8_t*>(w.data), static_cast<const float*>(w.quant.scale),
                         w.numel() / cols, cols, w.quant.block_rows, w.quant.block_cols,
                         w.quant.part_rows};
}

Mxfp4Matrix CudaBackend::Mxfp4(const Tensor& w) {
  const int64_t cols = w.dim(w.shape.rank - 1);
  return Mxfp4Matrix{static_cast<const uint8_t*>(w.data),
                           static_cast<const uint8_t*>(w.quant.scale), w.numel() / cols, cols};
}

absl::Status CudaBackend::ReserveDequant(const Tensor& w) {
  const size_t need = static_cast<size_t>(w.numel()) * 4;
  if (need <= dequant_bytes_) return absl::OkStatus();
  dequant_bytes_ = need;
  dequant_.clear();
  std::vector<cudaStream_t> streams = {stream_.get()};
  for (const CudaStream& s : side_) streams.push_back(s.get());
  for (cudaStream_t s : streams) {
    ASSIGN_OR_RETURN(DeviceBuffer b, AllocDevice(need));
    dequant_.emplace_back(s, std::move(b));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CudaBackend::DequantBuffer(const Tensor& w, DType dtype) {
  const cudaStream_t s = cur_stream();
  for (auto& [stream, buf] : dequant_) {
    if (stream != s) continue;
    Tensor t;
    t.data = buf.get();
    t.dtype = dtype;
    t.shape = w.shape;
    if (t.nbytes() > dequant_bytes_) break;
    return t;
  }
  return absl::InternalError("cuda backend: no dequantisation buffer for this stream and weight");
}

// x [M, groups * K] · W[groups * N, K] (grouped as GroupedLinear) with an FP8 weight: the
// weight-streaming kernel for decode rows, else W dequantised into op scratch (bf16, or fp32 in
// fp32 mode) and the GEMM of the dense path.
absl::Status CudaBackend::QuantLinear(const Tensor& x, const Tensor& w, int64_t groups, Tensor y) {
  if (w.quant.format != QuantFormat::kFp8Block) {
    return absl::UnimplementedError(absl::StrCat(
        "cuda backend: a dense projection with ", w.quant.format == QuantFormat::kMxfp4 ? "MXFP4" : "?",
        " weights ", w.shape.ToString(), " (only the routed experts are MXFP4 in the release)"));
  }
  const Fp8Matrix m = Fp8(w);
  const bool bf16 = options_.matrix_dtype == DType::kBF16;
  const int64_t group_rows = w.dim(0) / groups;
  if (!options_.batch_invariant && cuda::Fp8GemvFits(x.ptr<float>(), x.dim(0), m, group_rows)) {
    return Launch(LinearBenchOp(w), [&] {
      return cuda::Fp8Gemv(x.ptr<float>(), x.dim(0), m, group_rows, bf16, y.ptr<float>(),
                           cur_stream());
    });
  }
  if (Fp8BlocksFit(x, m, groups, group_rows)) {
    const absl::Status st = Fp8BlockLinear(LinearBenchOp(w), x, m, groups, group_rows, y);
    if (st.code() != absl::StatusCode::kUnimplemented) return st;
    // cuBLASLt has no FP8 block-scaled algorithm for this shape (nothing was written): the bf16
    // path, now and for the rest of the run.
    fp8_blocks_refused_.insert({groups, group_rows, m.cols});
    std::fprintf(stderr, "cuda backend: FP8 activations: %s; this product stays on bf16\n",
                 std::string(st.message()).c_str());
  }
  const DType wd = bf16 ? DType::kBF16 : DType::kF32;
  ASSIGN_OR_RETURN(Tensor dense, DequantBuffer(w, wd));
  RETURN_IF_ERROR(cuda::Fp8Dequantize(m, bf16, dense.data, cur_stream()));
  ASSIGN_OR_RETURN(const void* xin, MatrixOperand(x, dense));
  cuda::GemmShape s;
  s.m = x.dim(0);
  s.n = group_rows;
  s.k = w.dim(1);
  s.dtype = wd;
  if (groups > 1) {
    s.batch = groups;
    s.ldx = x.dim(1);
    s.ldy = y.dim(1);
    s.stride_x = s.k;
    s.stride_w = s.n * s.k;
    s.stride_y = s.n;
  }
  return Launch(LinearBenchOp(w),
                [&] { return RunGemm(s, xin, dense.data, y.ptr<float>()); });
}

bool CudaBackend::Fp8BlocksFit(const Tensor& x, const Fp8Matrix& m, int64_t groups,
                               int64_t group_rows) const {
  // The weights' scale grid must be cuBLASLt's [ceil(N / 128), ceil(K / 128)] per group: 128 x
  // 128 blocks, stacked parts and groups on whole blocks.
  const bool grid = m.block_rows == 128 && m.block_cols == 128 &&
                    (m.PartRows() == m.rows || m.PartRows() % 128 == 0) &&
                    (groups == 1 || group_rows % 128 == 0);
  // Every group's weight scales 16-byte aligned (the first group's choose the algorithm).
  const bool scales_aligned =
      Aligned16(m.scale) && (groups == 1 || m.ScaleIndex(group_rows, 0) % 4 == 0);
  // Whole 128 x 128 weight blocks only (K and each group's N multiples of 128, as every dense
  // FP8 projection of the released V4 checkpoints): with partial blocks (dsv4-tiny-fp8: K 64,
  // N 64) the products went wrong on the H200 (bench/results/2026-12-03-wgmma-experts run4: a
  // median logit error of 1.8 on that fixture); such shapes stay on the bf16 path.
  const bool whole = m.cols % 128 == 0 && group_rows % 128 == 0;
  return fp8_prefill_rows_ > 0 && x.dim(0) >= fp8_prefill_rows_ && grid && scales_aligned &&
         whole && x.dim(1) == groups * m.cols &&
         Aligned16(x.data) && Aligned16(m.w) &&
         !fp8_blocks_refused_.contains({groups, group_rows, m.cols});
}

// x [M, groups * K] to e4m3 group by group (x8 [groups][Mp, K]) with each group's 1 x 128 scales
// [ceil(K / 128), Mp] at g * xs_stride, then per group y[:, g * N ..] = x8[g] · W[g * N .., :]ᵀ.
// The rows are padded to Mp, a multiple of 16 (cuBLASLt has no block-scaled algorithm for an
// M such as 1081, which a chunked prefill step can have): zero activations, zero scales, their
// outputs in a padded copy of y of which the first M rows are kept.
absl::Status CudaBackend::Fp8BlockLinear(int bench_op, const Tensor& x, const Fp8Matrix& m,
                                         int64_t groups, int64_t group_rows, Tensor y) {
  const int64_t rows = x.dim(0), k = m.cols, ld = x.dim(1);
  const int64_t mp = (rows + 15) / 16 * 16, ldy = y.dim(1);
  ASSIGN_OR_RETURN(Tensor x8, OpScratch(DType::kU8, Shape{mp, ld}));
  // Each group's scales [ceil(K / 128), Mp] start on a 256-byte boundary (cuBLASLt's alignment).
  const int64_t kb = (k + 127) / 128, xs_stride = (kb * mp + 63) / 64 * 64;
  ASSIGN_OR_RETURN(Tensor xs, OpScratch(DType::kF32, Shape{groups * xs_stride}));
  Tensor yp = y;
  if (mp != rows) {
    ASSIGN_OR_RETURN(yp, OpScratch(DType::kF32, Shape{mp, ldy}));
  }
  return Launch(bench_op, [&]() -> absl::Status {
    if (mp != rows) {
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x8.data, 0, x8.nbytes(), cur_stream()));
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(xs.data, 0, xs.nbytes(), cur_stream()));
    }
    // Group by group, so that each group's 1 x 128 scales start at its first column.
    for (int64_t g = 0; g < groups; ++g) {
      RETURN_IF_ERROR(cuda::QuantizeFp8Groups(
          x.ptr<float>() + g * k, rows, k, ld, static_cast<uint8_t*>(x8.data) + g * mp * k,
          xs.ptr<float>() + g * xs_stride, cur_stream(), mp));
    }
    for (int64_t g = 0; g < groups; ++g) {
      cuda::GemmShape s;
      s.m = mp;
      s.n = group_rows;
      s.k = k;
      s.ldx = k;
      s.ldy = ldy;
      RETURN_IF_ERROR(gemm().RunFp8Blocks(
          s, static_cast<const uint8_t*>(x8.data) + g * mp * k, xs.ptr<float>() + g * xs_stride,
          m.w + g * group_rows * k, m.scale + m.ScaleIndex(g * group_rows, 0),
          yp.ptr<float>() + g * group_rows, cur_stream()));
    }
    if (mp != rows) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y.data, yp.data, sizeof(float) * rows * ldy,
                                           cudaMemcpyDeviceToDevice, cur_stream()));
    }
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::RunGemm(const cuda::GemmShape& s, const void* x, const void* w,
                                  float* y) {
  if (options_.batch_invariant) return cuda::InvariantGemm(s, x, w, y, cur_stream());
  return gemm().Run(s, x, w, y, cur_stream());
}

absl::Status CudaBackend::RmsNorm(const Tensor& x, const Tensor& weight, const RmsNormParams& p,
                                  Tensor y) {
  RETURN_IF_ERROR(op_checks::RmsNorm(x, weight, y));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "RmsNorm", x);
  const int64_t dim = x.dim(x.shape.rank - 1);
  return Launch(kBenchRmsNorm, [&] {
    return cuda::RmsNorm(x.ptr<float>(), F(weight), x.numel() / dim, dim, p.eps, y.ptr<float>(),
                         cur_stream());
  });
}

absl::Status CudaBackend::Rope(Tensor x, const RopeParams& p) {
  RETURN_IF_ERROR(op_checks::Rope(x, p, view_.num_tokens));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "Rope", x);
  return Launch(kBenchRope, [&] {
    return cuda::Rope(x.ptr<float>(), x.dim(0), x.dim(1), x.dim(2), p.rope_dims, F(p.inv_freq),
                      view_.positions, p.inverse, cur_stream());
  });
}

absl::Status CudaBackend::RmsNormRope(Tensor x, const Tensor& weight, const RmsNormParams& norm,
                                      const RopeParams& rope) {
  RETURN_IF_ERROR(op_checks::RmsNorm(x, weight, x));
  RETURN_IF_ERROR(op_checks::Rope(x, rope, view_.num_tokens));
  if (skip()) return absl::OkStatus();
  if (!cuda::RmsNormRopeFits(x.dim(2), rope.rope_dims, x.data, F(weight))) {
    return Backend::RmsNormRope(x, weight, norm, rope);
  }
  ProfileScope prof(profile_.get(), cur_stream(), "RmsNormRope", x);
  return Launch(kBenchRmsNormRope, [&] {
    return cuda::RmsNormRope(x.ptr<float>(), F(weight), x.dim(0), x.dim(1), x.dim(2), norm.eps,
                             rope.rope_dims, F(rope.inv_freq), view_.positions, rope.inverse,
                             cur_stream());
  });
}

absl::Status CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  RETURN_IF_ERROR(op_checks::Add(a, b, out));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "Add", a);
  return cuda::Add(a.ptr<float>(), b.ptr<float>(), out.ptr<float>(), a.numel(), cur_stream());
}

absl::Status CudaBackend::GatherLogitRows(const Tensor& x, Tensor out) {
  RETURN_IF_ERROR(op_checks::GatherLogitRows(x, out, num_logit_rows_));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "GatherLogitRows", out);
  return Launch(kBenchGatherLogitRows, [&] {
    return cuda::GatherRows(x.ptr<float>(), x.dim(1), logit_rows_, num_logit_rows_,
                            out.ptr<float>(), cur_stream());
  });
}

absl::Status CudaBackend::HcExpand(const Tensor& x, Tensor hs) {
  RETURN_IF_ERROR(op_checks::HcExpand(x, hs));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "HcExpand", hs);
  return cuda::HcExpand(x.ptr<float>(), hs.dim(0), hs.dim(1), hs.dim(2), hs.ptr<float>(),
                        cur_stream());
}

absl::StatusOr<Tensor> CudaBackend::HcMix(const Tensor& hs, const Tensor& fn) {
  // mix [parts, T, rows + 1]: split-K partial sums of flatten(hs) [T, n*D] · fn [rows, n*D]ᵀ in
  // fp32 plus, in the last column, the partial Σ hs² for the RMS scale (cuda/mhc.h). One kernel
  // for every T: N = rows is far too narrow for a GEMM to pay off.
  const int64_t T = hs.dim(0), nd = hs.dim(1) * hs.dim(2), rows = fn.numel() / nd;
  const int64_t parts = cuda::HcMixParts(T, nd);
  ASSIGN_OR_RETURN(Tensor mix, OpScratch(DType::kF32, Shape{parts, T, rows + 1}));
  RETURN_IF_ERROR(
      cuda::HcMix(hs.ptr<float>(), T, nd, fn.ptr<float>(), rows, mix.ptr<float>(), cur_stream(),
                  hc_staged_));
  return mix;
}

absl::Status CudaBackend::HcPre(const Tensor& hs, const Tensor& fn, const Tensor& base,
                                const Tensor& scale, const HcParams& p, Tensor collapsed,
                                Tensor post, Tensor comb) {
  RETURN_IF_ERROR(op_checks::HcPre(hs, fn, base, scale, p, collapsed, post, comb));
  if (skip()) return absl::OkStatus();
  RETURN_IF_ERROR(JoinGates());
  ProfileScope prof(profile_.get(), cur_stream(), "HcPre", hs);
  ASSIGN_OR_RETURN(Tensor mix, HcMix(hs, fn));
  return cuda::HcPre(op_checks::HcShapeOf(hs, p), hs.ptr<float>(), mix.ptr<float>(), mix.dim(0),
                     F(base), F(scale), collapsed.ptr<float>(), post.ptr<float>(),
                     comb.ptr<float>(), cur_stream());
}

absl::Status CudaBackend::HcPost(const Tensor& hs, const Tensor& f, const Tensor& post,
                                 const Tensor& comb, Tensor out) {
  RETURN_IF_ERROR(op_checks::HcPost(hs, f, post, comb, out));
  if (skip()) return absl::OkStatus();
  RETURN_IF_ERROR(JoinGates());
  ProfileScope prof(profile_.get(), cur_stream(), "HcPost", hs);
  HcParams p;
  p.hc_mult = hs.dim(1);
  return Launch(kBenchHcPost, [&] {
    return cuda::HcPost(op_checks::HcShapeOf(hs, p), hs.ptr<float>(), f.ptr<float>(),
                        post.ptr<float>(), comb.ptr<float>(), out.ptr<float>(), cur_stream());
  });
}

absl::Status CudaBackend::HcHead(const Tensor& hs, const Tensor& fn, const Tensor& base,
                                 const Tensor& scale, const HcParams& p, Tensor y) {
  RETURN_IF_ERROR(op_checks::HcHead(hs, fn, base, scale, y));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "HcHead", hs);
  ASSIGN_OR_RETURN(Tensor mix, HcMix(hs, fn));
  return cuda::HcHead(op_checks::HcShapeOf(hs, p), hs.ptr<float>(), mix.ptr<float>(), mix.dim(0),
                      F(base), F(scale), y.ptr<float>(), cur_stream());
}

// The kernels of a boundary (HcPreNorm; HcPostPreNorm with `in`, hs then being the streams it
// writes): one cluster launch where HcClusterFits, else the mix (HcPostMix with `in`) and
// HcPreNorm; then post and comb, on the gates stream (DeferredGates) unless DSV4_HC_DEFER_GATES=0
// has the boundary kernel write them.
absl::Status CudaBackend::BoundaryKernels(const cuda::HcDims& d, const cuda::HcPostIn* in,
                                          const Tensor& hs, const HcGateNorm& g, Tensor normed,
                                          Tensor post, Tensor comb) {
  const int64_t nd = hs.dim(1) * hs.dim(2), rows = g.fn.numel() / nd;
  Tensor gates;
  if (defer_gates_) {
    ASSIGN_OR_RETURN(gates, OpScratch(DType::kF32, Shape{d.tokens, cuda::HcGateValues(d.n)}));
  }
  float* const gates_out = defer_gates_ ? gates.ptr<float>() : nullptr;
  float* const post_out = defer_gates_ ? nullptr : post.ptr<float>();
  float* const comb_out = defer_gates_ ? nullptr : comb.ptr<float>();
  if (hc_cluster_ && cuda::HcClusterFits(d, rows, hs.ptr<float>(), g.fn.ptr<float>(),
                                         normed.ptr<float>(), F(g.norm_weight))) {
    RETURN_IF_ERROR(cuda::HcClusterNorm(
        d, in, hs.ptr<float>(), g.fn.ptr<float>(), rows, F(g.base), F(g.scale), F(g.norm_weight),
        g.norm.eps, normed.ptr<float>(), post_out, comb_out, gates_out, cur_stream()));
  } else {
    Tensor mix;
    if (in == nullptr) {
      ASSIGN_OR_RETURN(mix, HcMix(hs, g.fn));
    } else {
      ASSIGN_OR_RETURN(
          mix, OpScratch(DType::kF32, Shape{cuda::HcMixParts(d.tokens, nd), d.tokens, rows + 1}));
      RETURN_IF_ERROR(cuda::HcPostMix(d, in->hs, in->f, in->post, in->comb, hs.ptr<float>(),
                                      g.fn.ptr<float>(), rows, mix.ptr<float>(), cur_stream(),
                                      hc_staged_));
    }
    RETURN_IF_ERROR(cuda::HcPreNorm(d, hs.ptr<float>(), mix.ptr<float>(), mix.dim(0), F(g.base),
                                    F(g.scale), F(g.norm_weight), g.norm.eps, normed.ptr<float>(),
                                    post_out, comb_out, gates_out, cur_stream(), hc_staged_));
  }
  return defer_gates_ ? DeferredGates(d, gates, g, post, comb) : absl::OkStatus();
}

// The sub-block boundaries in two kernels instead of four (HcPost, mix, HcPre, RmsNorm): the
// mix kernel computes HcPost's streams as it reads them (cuda::HcPostMix), and the gate kernel
// normalises its collapsed row (cuda::HcPreNorm). Up to 16 tokens (decode) both are one launch,
// a thread-block cluster per token (cuda::HcClusterNorm, the same bits). Shapes the kernels do
// not cover run the Backend defaults (the ops one by one).
absl::Status CudaBackend::HcPreNorm(const Tensor& hs, const HcGateNorm& g, Tensor normed,
                                    Tensor post, Tensor comb) {
  RETURN_IF_ERROR(op_checks::HcPre(hs, g.fn, g.base, g.scale, g.hc, normed, post, comb));
  RETURN_IF_ERROR(op_checks::RmsNorm(normed, g.norm_weight, normed));
  const cuda::HcDims d = op_checks::HcShapeOf(hs, g.hc);
  if (!cuda::HcNormFits(d, hs.ptr<float>(), normed.ptr<float>(), F(g.norm_weight))) {
    return Backend::HcPreNorm(hs, g, normed, post, comb);
  }
  if (skip()) return absl::OkStatus();
  RETURN_IF_ERROR(JoinGates());
  ProfileScope prof(profile_.get(), cur_stream(), "HcPreNorm", hs);
  return Launch(kBenchHcPreNorm,
                [&] { return BoundaryKernels(d, nullptr, hs, g, normed, post, comb); });
}

absl::Status CudaBackend::HcPostPreNorm(const Tensor& hs, const Tensor& f, const Tensor& post,
                                        const Tensor& comb, Tensor hs_out, const HcGateNorm& g,
                                        Tensor normed, Tensor post_out, Tensor comb_out) {
  RETURN_IF_ERROR(op_checks::HcPost(hs, f, post, comb, hs_out));
  RETURN_IF_ERROR(
      op_checks::HcPre(hs_out, g.fn, g.base, g.scale, g.hc, normed, post_out, comb_out));
  RETURN_IF_ERROR(op_checks::RmsNorm(normed, g.norm_weight, normed));
  const cuda::HcDims d = op_checks::HcShapeOf(hs_out, g.hc);
  const int64_t nd = hs.dim(1) * hs.dim(2), rows = g.fn.numel() / nd;
  if (!cuda::HcPostMixFits(d, rows, hs.ptr<float>(), f.ptr<float>(), hs_out.ptr<float>(),
                           g.fn.ptr<float>()) ||
      !cuda::HcNormFits(d, hs_out.ptr<float>(), normed.ptr<float>(), F(g.norm_weight))) {
    return Backend::HcPostPreNorm(hs, f, post, comb, hs_out, g, normed, post_out, comb_out);
  }
  if (skip()) return absl::OkStatus();
  RETURN_IF_ERROR(JoinGates());  // post and comb of the previous boundary
  ProfileScope prof(profile_.get(), cur_stream(), "HcPostPreNorm", hs);
  cuda::HcPostIn in;
  in.hs = hs.ptr<float>();
  in.f = f.ptr<float>();
  in.post = post.ptr<float>();
  in.comb = comb.ptr<float>();
  return Launch(kBenchHcPostPreNorm,
                [&] { return BoundaryKernels(d, &in, hs_out, g, normed, post_out, comb_out); });
}

absl::Status CudaBackend::HcHeadNorm(const Tensor& hs, const HcGateNorm& g, Tensor y) {
  RETURN_IF_ERROR(op_checks::HcHead(hs, g.fn, g.base, g.scale, y));
  RETURN_IF_ERROR(op_checks::RmsNorm(y, g.norm_weight, y));
  const cuda::HcDims d = op_checks::HcShapeOf(hs, g.hc);
  if (!cuda::HcNormFits(d, hs.ptr<float>(), y.ptr<float>(), F(g.norm_weight))) {
    return Backend::HcHeadNorm(hs, g, y);
  }
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "HcHeadNorm", hs);
  const int64_t rows = g.fn.numel() / (hs.dim(1) * hs.dim(2));
  const bool cluster =
      hc_cluster_ && cuda::HcClusterFits(d, rows, hs.ptr<float>(), g.fn.ptr<float>(),
                                         y.ptr<float>(), F(g.norm_weight));
  return Launch(kBenchHcHeadNorm, [&]() -> absl::Status {
    if (cluster) {
      return cuda::HcClusterNorm(d, nullptr, hs.ptr<float>(), g.fn.ptr<float>(), rows, F(g.base),
                                 F(g.scale), F(g.norm_weight), g.norm.eps, y.ptr<float>(), nullptr,
                                 nullptr, nullptr, cur_stream());
    }
    ASSIGN_OR_RETURN(Tensor mix, HcMix(hs, g.fn));
    return cuda::HcHeadNorm(d, hs.ptr<float>(), mix.ptr<float>(), mix.dim(0), F(g.base), F(g.scale),
                            F(g.norm_weight), g.norm.eps, y.ptr<float>(), cur_stream());
  });
}

absl::Status CudaBackend::Compress(const CompressParams& p, const Tensor& a, const Tensor& z,
                                   Tensor state, Tensor entries) {
  RETURN_IF_ERROR(op_checks::Compress(p, a, z, state, entries, view_.num_tokens, view_.block_size));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "Compress", a);
  cuda::CompressorDims d;
  d.ratio = p.ratio;
  d.overlap = p.overlap;
  d.dim = p.dim;
  d.rope_dims = p.rope.rope_dims;
  d.norm_eps = p.norm_eps;
  return Launch(kBenchCompress, [&] {
    return cuda::Compress(d, view_, a.ptr<float>(), z.ptr<float>(), F(p.position_bias),
                          F(p.norm_weight), F(p.rope.inv_freq), state.ptr<float>(),
                          entries.ptr<float>(), cur_stream());
  });
}

absl::Status CudaBackend::IndexerTopK(const IndexerParams& p, const Tensor& q,
                                      const Tensor& weights, const Tensor& keys, Tensor out) {
  RETURN_IF_ERROR(
      op_checks::IndexerTopK(p, q, weights, keys, out, view_.num_tokens, view_.block_size));
  cuda::IndexerDims d;
  d.heads = q.dim(1);
  d.dim = q.dim(2);
  d.ratio = p.ratio;
  d.topk = p.topk;
  d.weight_scale = p.weight_scale;
  d.score_scale = p.score_scale;
  RETURN_IF_ERROR(EnterEager());  // piecewise: the sparse scoring runs between segments
  ProfileScope prof(profile_.get(), stream_.get(), "IndexerTopK", q, keys);
  ASSIGN_OR_RETURN(const bool capturing, Capturing());
  ASSIGN_OR_RETURN(const int64_t max_pos, LaunchMaxPosition());
  // Visible entries of the latest token: floor((pos + 1) / m); the bound while capturing.
  const int64_t max_visible = (max_pos + 1) / p.ratio;
  // The short-context shortcut is a host decision on this step's positions: eager steps only.
  const bool shortcut_allowed = !capturing || shortcut_in_capture_;
  if (shortcut_allowed && !view_.force_indexer_scoring &&
      (int64_t{max_position_} + 1) / p.ratio <= p.topk) {
    RETURN_IF_ERROR(cuda::IndexerSelectAll(d, view_, out.ptr<int32_t>(), stream_.get()));
    return LeaveEager();
  }
  // One scores buffer per step, shared by the CSA layers (they run one after another on the main
  // stream): under capture it is sized by the capacity bound, which can be large.
  const int64_t need = int64_t{view_.num_tokens} * std::max<int64_t>(max_visible, 1);
  if (step_scores_.empty() || step_scores_.numel() < need) {
    ASSIGN_OR_RETURN(step_scores_, OpScratch(DType::kF32, Shape{need}));
  }
  const Tensor& scores = step_scores_;
  RETURN_IF_ERROR(Launch(kBenchIndexerTopK, [&] {
    return cuda::IndexerTopK(d, view_, q.ptr<float>(), weights.ptr<float>(), keys.ptr<float>(),
                             max_visible, indexer_tf32_ && cuda::IndexerTf32Fits(d),
                             scores.ptr<float>(), out.ptr<int32_t>(), stream_.get());
  }));
  return LeaveEager();
}

absl::Status CudaBackend::Attention(const AttentionParams& p, const Tensor& q, const Tensor& kv,
                                    const Tensor& ring, const Tensor& entries,
                                    const Tensor& selected, const Tensor& sinks, Tensor out) {
  RETURN_IF_ERROR(op_checks::Attention(p, q, kv, ring, entries, selected, sinks, out,
                                       view_.num_tokens, view_.block_size));
  if (p.out_rope.rope_dims > 0) RETURN_IF_ERROR(op_checks::Rope(out, p.out_rope, view_.num_tokens));
  cuda::AttentionDims d;
  d.heads = q.dim(1);
  d.dim = q.dim(2);
  d.window = p.window;
  d.ratio = p.ratio;
  d.topk = selected.empty() ? 0 : selected.dim(1);
  d.dense_compressed = p.dense_compressed;
  d.scale = p.scale;
  // bf16 precision: tensor-core attention (bf16 q/keys/P, fp32 accumulate and softmax).
  d.bf16_tensor_cores = matrix_dtype() == DType::kBF16;
  d.batch_invariant = options_.batch_invariant;
  d.out_rope_dims = p.out_rope.rope_dims;
  d.out_rope_freq = F(p.out_rope.inv_freq);
  d.out_rope_inverse = p.out_rope.inverse;
  RETURN_IF_ERROR(EnterEager());  // piecewise: the attention core runs between segments
  const char* kind = p.ratio == 0         ? "Attention sliding"
                     : p.dense_compressed ? "Attention HCA"
                                          : "Attention CSA";
  ProfileScope prof(profile_.get(), stream_.get(), kind, q);
  // Keys of the latest token: its window plus its visible (dense) or selected entries; sized by
  // the capacity bound while capturing (the key splits are baked into the graph).
  ASSIGN_OR_RETURN(const int64_t max_pos, LaunchMaxPosition());
  const int64_t upto = max_pos + 1;
  const int64_t visible = p.ratio > 0 ? upto / p.ratio : 0;
  d.max_keys = std::min<int64_t>(p.window, upto) +
               (p.dense_compressed ? visible : std::min<int64_t>(visible, d.topk));
  float* ws = nullptr;
  if (const int64_t n = cuda::AttentionWorkspaceFloats(d, view_.num_tokens); n > 0) {
    ASSIGN_OR_RETURN(Tensor w, OpScratch(DType::kF32, Shape{n}));
    ws = w.ptr<float>();
  }
  RETURN_IF_ERROR(Launch(kBenchAttention, [&] {
    return cuda::Attention(d, view_, q.ptr<float>(), kv.ptr<float>(), ring.ptr<float>(),
                           p.ratio > 0 ? F(entries) : nullptr, I(selected), F(sinks),
                           out.ptr<float>(), ws, stream_.get());
  }));
  return LeaveEager();
}

absl::Status CudaBackend::RingWrite(const Tensor& kv, Tensor ring) {
  RETURN_IF_ERROR(op_checks::RingWrite(kv, ring, view_.num_tokens));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "RingWrite", kv);
  return Launch(kBenchRingWrite, [&] {
    return cuda::RingWrite(kv.ptr<float>(), ring.dim(2), ring.dim(1), view_, ring.ptr<float>(),
                           cur_stream());
  });
}

absl::Status CudaBackend::RingSnapshot(const Tensor& kv, Tensor ring) {
  RETURN_IF_ERROR(op_checks::RingWrite(kv, ring, view_.num_tokens));
  if (skip() || view_.num_snapshots == 0) return absl::OkStatus();
  return cuda::RingSnapshot(kv.ptr<float>(), ring.dim(2), ring.dim(1), view_, ring.ptr<float>(),
                            cur_stream());
}

absl::Status CudaBackend::CompressSnapshot(const CompressParams& p, const Tensor& a,
                                           const Tensor& z, Tensor state) {
  RETURN_IF_ERROR(op_checks::CompressSnapshot(p, a, z, state, view_.num_tokens));
  if (skip() || view_.num_snapshots == 0) return absl::OkStatus();
  CompressorShape s;
  s.ratio = p.ratio;
  s.overlap = p.overlap;
  s.dim = p.dim;
  return cuda::CompressSnapshot(s, view_, a.ptr<float>(), z.ptr<float>(), F(p.position_bias),
                                state.ptr<float>(), cur_stream());
}

absl::Status CudaBackend::CopyStateRows(std::span<const Tensor> pools,
                                        std::span<const std::pair<int32_t, int32_t>> copies) {
  if (copies.empty()) return absl::OkStatus();
  std::vector<cuda::StatePool> table;
  table.reserve(pools.size());
  for (const Tensor& pool : pools) {
    RETURN_IF_ERROR(op_checks::CopyStateRows(pool, copies));
    table.push_back({pool.ptr<float>(), pool.numel() / pool.dim(0)});
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  return cuda::CopyStateRows(table, copies, stream_.get());
}

absl::Status CudaBackend::Route(const RouterParams& p, const Tensor& logits, const Tensor& bias,
                                const Tensor& tid2eid, Tensor idx, Tensor weights) {
  RETURN_IF_ERROR(op_checks::Route(p, logits, bias, tid2eid, idx, weights, view_.num_tokens));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "Route", logits);
  cuda::RouterDims d;
  d.tokens = logits.dim(0);
  d.experts = logits.dim(1);
  d.top_k = p.top_k;
  d.routed_scale = p.routed_scale;
  RETURN_IF_ERROR(Launch(kBenchRoute, [&] {
    return cuda::Route(d, logits.ptr<float>(), F(bias), p.hash ? I(tid2eid) : nullptr,
                       view_.token_ids, idx.ptr<int32_t>(), weights.ptr<float>(), cur_stream());
  }));
  if (p.local_experts == 0) return absl::OkStatus();
  // Expert parallelism: other ranks' experts become weight-0 assignments of local expert 0.
  return cuda::LocalizeExperts(idx.ptr<int32_t>(), weights.ptr<float>(), idx.numel(),
                               p.expert_begin, p.local_experts, cur_stream());
}

absl::Status CudaBackend::AttachCommunicator(Communicator* comm) {
  comm_ = comm;
  return absl::OkStatus();
}

absl::Status CudaBackend::SupportsTensorParallel(const ParallelLayout& layout) const {
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor_parallel_size ", layout.world_size, " on a cuda backend without a communicator"));
  }
  if (comm_->rank() != layout.rank || comm_->world_size() != layout.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cuda backend's communicator is rank ", comm_->rank(), " of ", comm_->world_size(),
        "; the model is rank ", layout.rank, " of ", layout.world_size));
  }
  return absl::OkStatus();
}

// A device communicator (NCCL) all-reduces in place on the current stream: stream-ordered, and
// captured into graphs like any kernel. A host one (Gloo) is host-staged: the partial sums go to
// pinned host memory, are all-reduced there and come back; eager steps only.
absl::Status CudaBackend::AllReduceSum(Tensor x) {
  if (comm_ == nullptr) return Backend::AllReduceSum(x);
  if (x.dtype != DType::kF32) return absl::InvalidArgumentError("AllReduceSum: f32 tensors only");
  if (comm_->memory_space() == MemorySpace::kDevice) {
    if (skip()) return absl::OkStatus();  // a piecewise replay: the segment's graph holds it
    return comm_->AllReduceSum(x.data, x.data, static_cast<size_t>(x.numel()), DType::kF32,
                               cur_stream());
  }
  ASSIGN_OR_RETURN(const bool capturing, Capturing());
  if (capturing || skip()) {
    return absl::FailedPreconditionError(
        "AllReduceSum: a host-staged (Gloo) all-reduce cannot run inside a CUDA graph");
  }
  const size_t bytes = static_cast<size_t>(x.numel()) * 4;
  if (collective_host_.bytes() < bytes) {
    ASSIGN_OR_RETURN(collective_host_, AllocPinned(bytes));
  }
  const auto t0 = std::chrono::steady_clock::now();
  cudaStream_t st = cur_stream();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(collective_host_.get(), x.data, bytes, cudaMemcpyDeviceToHost, st));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
  RETURN_IF_ERROR(comm_->AllReduceSum(collective_host_.get(), collective_host_.get(),
                                      static_cast<size_t>(x.numel()), DType::kF32, nullptr));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x.data, collective_host_.get(), bytes, cudaMemcpyHostToDevice, st));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

absl::Status CudaBackend::MoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                                     const MoeWeights& w, float swiglu_limit, Tensor out) {
  RETURN_IF_ERROR(op_checks::MoeExperts(u, idx, weights, w, out));
  if (w.gate_up.quantized()) return QuantMoeExperts(u, idx, weights, w, swiglu_limit, out);
  const Tensor &gate_up = w.gate_up, &down = w.down;
  // One token with bf16 weights: routed and shared experts in two weight-streaming kernels
  // (kernels/cuda/moe_decode.h), no sort and no combine. (h is op scratch: 256-byte aligned.)
  const bool shared = !w.shared_gate_up.empty();
  cuda::MoeDecodeArgs a;
  a.dim = u.dim(1);
  a.inter = down.dim(2);
  a.experts = gate_up.dim(0);
  a.top_k = idx.dim(1);
  a.swiglu_limit = swiglu_limit;
  a.u = u.ptr<float>();
  a.idx = idx.ptr<int32_t>();
  a.weights = weights.ptr<float>();
  a.gate_up = gate_up.data;
  a.down = down.data;
  a.shared_gate_up = shared ? w.shared_gate_up.data : nullptr;
  a.shared_down = shared ? w.shared_down.data : nullptr;
  a.shared_h = shared && !w.shared_h.empty() ? w.shared_h.ptr<float>() : nullptr;
  a.out = out.ptr<float>();
  // (The fused kernels give the shared expert the routed intermediate size.)
  const bool fused = row_gemv_ && u.dim(0) == 1 && gate_up.dtype == DType::kBF16 &&
                     (!shared || (w.shared_gate_up.dtype == DType::kBF16 &&
                                  w.shared_down.dim(1) == a.inter)) &&
                     cuda::MoeDecodeFits(a);
  // A piecewise replay skips the launches but must make the same model-scratch allocations as
  // its capture (the unfused shared expert allocates model scratch): decide first, skip after.
  if (skip()) return fused ? absl::OkStatus() : AddSharedExpert(*this, u, w, swiglu_limit, out);
  if (fused) {
    ProfileScope prof(profile_.get(), cur_stream(), "MoeExperts", u, gate_up);
    ASSIGN_OR_RETURN(Tensor h, OpScratch(DType::kF32, Shape{cuda::kMoeDecodeMaxSlots * a.inter}));
    a.h = h.ptr<float>();
    return Launch(kBenchMoeExperts, [&] { return cuda::MoeDecodeBf16(a, cur_stream()); });
  }
  RETURN_IF_ERROR(RoutedExperts(u, idx, weights, w, swiglu_limit, out));
  return AddSharedExpert(*this, u, w, swiglu_limit, out);
}

// Routed experts in FP8 or MXFP4 (the shared expert dense or FP8): one token through the fused
// weight-streaming kernels when they take it, else the grouped quantised kernels and the shared
// expert through Linear.
absl::Status CudaBackend::QuantMoeExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                                          const MoeWeights& w, float swiglu_limit, Tensor out) {
  const Tensor &gate_up = w.gate_up, &down = w.down;
  cuda::QuantExperts q;
  q.format = gate_up.quant.format;
  if (q.format == QuantFormat::kFp8Block) {
    q.fp8_gate_up = Fp8(gate_up);
    q.fp8_down = Fp8(down);
  } else {
    q.fp4_gate_up = Mxfp4(gate_up);
    q.fp4_down = Mxfp4(down);
  }
  const bool shared = !w.shared_gate_up.empty();
  const bool shared_fp8 = shared && w.shared_gate_up.quant.format == QuantFormat::kFp8Block &&
                          w.shared_down.quant.format == QuantFormat::kFp8Block;
  cuda::MoeDecodeArgs a;
  a.dim = u.dim(1);
  a.inter = down.dim(2);
  a.experts = gate_up.dim(0);
  a.top_k = idx.dim(1);
  a.swiglu_limit = swiglu_limit;
  a.u = u.ptr<float>();
  a.idx = idx.ptr<int32_t>();
  a.weights = weights.ptr<float>();
  a.shared_gate_up = shared && !shared_fp8 ? w.shared_gate_up.data : nullptr;
  a.shared_down = shared && !shared_fp8 ? w.shared_down.data : nullptr;
  a.shared_h = shared && !w.shared_h.empty() ? w.shared_h.ptr<float>() : nullptr;
  a.out = out.ptr<float>();
  const Fp8Matrix sgu = shared_fp8 ? Fp8(w.shared_gate_up) : Fp8Matrix{};
  const Fp8Matrix sdn = shared_fp8 ? Fp8(w.shared_down) : Fp8Matrix{};
  const bool shared_ok = !shared || shared_fp8 ||
                         (w.shared_gate_up.dtype == DType::kBF16 && !w.shared_gate_up.quantized());
  const bool fused = row_gemv_ && u.dim(0) == 1 && options_.matrix_dtype == DType::kBF16 &&
                     shared_ok && (!shared || w.shared_down.dim(1) == a.inter) &&
                     cuda::MoeDecodeQuantFits(a, q);
  if (skip()) return fused ? absl::OkStatus() : AddSharedExpert(*this, u, w, swiglu_limit, out);
  if (fused) {
    ProfileScope prof(profile_.get(), cur_stream(), "MoeExperts", u, gate_up);
    ASSIGN_OR_RETURN(Tensor h, OpScratch(DType::kF32, Shape{cuda::kMoeDecodeMaxSlots * a.inter}));
    a.h = h.ptr<float>();
    return Launch(kBenchMoeExperts, [&] {
      return cuda::MoeDecodeQuant(a, q, shared_fp8 ? &sgu : nullptr, shared_fp8 ? &sdn : nullptr,
                                  cur_stream());
    });
  }
  {
    ProfileScope prof(profile_.get(), cur_stream(), "MoeExperts", u, gate_up);
    cuda::ExpertsDims d;
    d.tokens = u.dim(0);
    d.dim = u.dim(1);
    d.inter = down.dim(2);
    d.experts = gate_up.dim(0);
    d.top_k = idx.dim(1);
    d.swiglu_limit = swiglu_limit;
    ASSIGN_OR_RETURN(Tensor ws, OpScratch(DType::kU8, Shape{static_cast<int64_t>(
                                                          cuda::MoeWorkspaceBytes(d))}));
    RETURN_IF_ERROR(cuda::MoeExpertsQuant(d, u.ptr<float>(), idx.ptr<int32_t>(),
                                          weights.ptr<float>(), q,
                                          options_.matrix_dtype == DType::kF32, ws.data,
                                          out.ptr<float>(), cur_stream(), moe_kernels_));
  }
  return AddSharedExpert(*this, u, w, swiglu_limit, out);
}

absl::Status CudaBackend::SharedExpertUp(const Tensor& u, const MoeWeights& w,
                                         float swiglu_limit, Tensor h) {
  RETURN_IF_ERROR(op_checks::SharedExpertUp(u, w, h));
  cuda::MoeDecodeArgs a;
  a.dim = u.dim(1);
  a.inter = w.shared_down.dim(1);
  a.swiglu_limit = swiglu_limit;
  a.u = u.ptr<float>();
  a.shared_gate_up = w.shared_gate_up.data;
  a.h = h.ptr<float>();
  // One token with bf16 weights: one weight-streaming kernel (gate/up rows + SwiGLU); otherwise
  // the Backend default (GEMM + SwiGlu), decided by shape before skip() (scratch parity).
  if (!(row_gemv_ && u.dim(0) == 1 && w.shared_gate_up.dtype == DType::kBF16 &&
        cuda::SharedExpertUpFits(a))) {
    return Backend::SharedExpertUp(u, w, swiglu_limit, h);
  }
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "SharedExpertUp", u, w.shared_gate_up);
  return Launch(kBenchSharedExpertUp, [&] { return cuda::SharedExpertUpBf16(a, cur_stream()); });
}

absl::Status CudaBackend::RoutedExperts(const Tensor& u, const Tensor& idx, const Tensor& weights,
                                        const MoeWeights& w, float swiglu_limit, Tensor out) {
  const Tensor &gate_up = w.gate_up, &down = w.down;
  ProfileScope prof(profile_.get(), cur_stream(), "MoeExperts", u, gate_up);
  cuda::ExpertsDims d;
  d.tokens = u.dim(0);
  d.dim = u.dim(1);
  d.inter = down.dim(2);
  d.experts = gate_up.dim(0);
  d.top_k = idx.dim(1);
  d.swiglu_limit = swiglu_limit;
  ASSIGN_OR_RETURN(Tensor ws,
                   OpScratch(DType::kU8, Shape{static_cast<int64_t>(cuda::MoeWorkspaceBytes(d))}));
  return cuda::MoeExperts(d, u.ptr<float>(), idx.ptr<int32_t>(), weights.ptr<float>(), gate_up.data,
                          down.data, gate_up.dtype, ws.data, out.ptr<float>(), cur_stream(),
                          moe_kernels_);
}

absl::Status CudaBackend::SwiGlu(const Tensor& gate_up, float limit, Tensor h) {
  RETURN_IF_ERROR(op_checks::SwiGlu(gate_up, h));
  if (skip()) return absl::OkStatus();
  ProfileScope prof(profile_.get(), cur_stream(), "SwiGlu", gate_up);
  return cuda::SwiGlu(gate_up.ptr<float>(), h.dim(0), h.dim(1), limit, h.ptr<float>(),
                      cur_stream());
}

}  // namespace dsv4
