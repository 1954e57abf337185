// GPU kernel benchmark: each DSV4 op of the CUDA backend at DSV4-Flash decode/prefill shapes,
// with achieved HBM bandwidth (bytes each call must move at least once) or FLOP rate, next to the
// ceilings: HBM taken as 4.8 TB/s, bf16 dense as 790 TFLOP/s (a streaming add through the
// backend's elementwise kernel is printed for reference; it does not reach the HBM ceiling:
// the expert kernels stream faster).
// Times are wall clock per call over many back-to-back launches on the backend's stream, closed
// by a synchronising copy (launch overhead included: that is what an eager step pays).
//   dsv4_gpu_kernels_bench [--iters N] [--warmup-ms T] [--precision bf16|fp32]
//                          [--decode-only | --fp8-only | --moe-quant-only]
// --warmup-ms T: before each timing, calls for T ms (the first rows after the host-side weight
// generation otherwise run while the GPU's clocks are still coming up).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "worker/checkpoint/stored_weight.h"
#include "worker/worker_factory.h"

namespace dsv4 {
namespace {

using Clock = std::chrono::steady_clock;

struct Ctx {
  Backend* be = nullptr;
  int iters = 50;
  double warmup_ms = 0;  // --warmup-ms: calls before timing until this long has passed (clocks up)
  double hbm = 4.8e12;  // the H200's HBM bandwidth, bytes/s
};

// Seconds per call of `op` (after one warm-up call, or calls for c.warmup_ms).
double Time(Ctx& c, const std::function<absl::Status()>& op, const Tensor& sync) {
  float sink[1];
  if (absl::Status s = op(); !s.ok()) {
    std::fprintf(stderr, "op failed: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  (void)c.be->CopyToHost(sync.View(Shape{1}), sink);
  for (const auto w0 = Clock::now();
       std::chrono::duration<double, std::milli>(Clock::now() - w0).count() < c.warmup_ms;) {
    for (int i = 0; i < 16; ++i) (void)op();
    (void)c.be->CopyToHost(sync.View(Shape{1}), sink);
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < c.iters; ++i) (void)op();
  (void)c.be->CopyToHost(sync.View(Shape{1}), sink);
  return std::chrono::duration<double>(Clock::now() - t0).count() / c.iters;
}

void Row(const Ctx& c, const std::string& op, const std::string& shape, double sec, double bytes,
         double flops, bool bf16_flops) {
  const double gbs = bytes / sec / 1e9;
  const double tf = flops / sec / 1e12;
  std::printf("%-18s %-34s %10.1f %10.1f %7.1f%% %9.2f %7.2f%%\n", op.c_str(), shape.c_str(),
              sec * 1e6, gbs, 100.0 * bytes / sec / c.hbm, tf,
              bf16_flops ? 100.0 * tf / 790.0 : 0.0);
}

void Meta(Backend* be, StepMeta* m, int32_t seqs, int32_t ctx, int32_t tokens_each,
          int32_t block_size) {
  *m = StepMeta{};
  m->num_seqs = seqs;
  m->block_size = block_size;
  m->block_stride = (ctx + tokens_each + block_size - 1) / block_size;
  for (int32_t s = 0; s < seqs; ++s) {
    m->seq_begin.push_back(static_cast<int32_t>(m->token_ids.size()));
    m->seq_start_pos.push_back(ctx);
    m->state_slot.push_back(s);
    for (int32_t b = 0; b < m->block_stride; ++b) m->block_table.push_back(s * m->block_stride + b);
    for (int32_t i = 0; i < tokens_each; ++i) {
      m->token_ids.push_back((s * 31 + i) % 1000);
      m->positions.push_back(ctx + i);
      m->token_seq.push_back(s);
    }
    m->logit_rows.push_back(static_cast<int32_t>(m->token_ids.size()) - 1);
  }
  m->seq_begin.push_back(static_cast<int32_t>(m->token_ids.size()));
  m->num_tokens = static_cast<int32_t>(m->token_ids.size());
  (void)be->BeginStep(*m);
}

Tensor Rand(Backend* be, Shape shape, uint64_t seed, float a, WeightUse use = WeightUse::kParam) {
  SyntheticSpec spec{DType::kF32, shape, seed, -a, a, 1};
  auto t = be->CreateSyntheticWeight(spec, use);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    std::exit(1);
  }
  return *t;
}

// A projection weight [n, k] by name.
struct G {
  const char* name;
  int64_t n, k;
};

// Every single-token product of a DSV4-Flash decode step at batch 1, on `be`; rows tagged `path`.
void DecodeRows(Ctx& c, const char* path, double wb) {
  Backend& be = *c.be;
  StepMeta meta;
  Meta(c.be, &meta, 1, 0, 1, 128);
  const std::string tag = std::string(" [") + path + "]";
  for (const G& g : std::vector<G>{{"q_a_proj", 1024, 4096},
                                   {"q_b_proj", 32768, 1024},
                                   {"kv_proj", 512, 4096},
                                   {"idx_q_b_proj", 8192, 1024},
                                   {"router_gate", 256, 4096},
                                   {"idx_weights", 64, 4096},
                                   {"o_b_proj", 4096, 8192},
                                   {"lm_head", 129280, 4096}}) {
    Tensor w = Rand(c.be, Shape{g.n, g.k}, 3, 0.02f, WeightUse::kMatrix);
    Tensor x = *be.Scratch(DType::kF32, Shape{1, g.k});
    Tensor y = *be.Scratch(DType::kF32, Shape{1, g.n});
    const double t = Time(c, [&] { return be.Linear(x, w, y); }, y);
    Row(c, g.name, "M=1 N=" + std::to_string(g.n) + " K=" + std::to_string(g.k) + tag, t,
        g.n * g.k * wb + (g.k + g.n) * 4.0, 2.0 * g.n * g.k, true);
  }
  {
    Tensor w = Rand(c.be, Shape{8 * 1024, 4096}, 4, 0.02f, WeightUse::kMatrix);
    Tensor x = *be.Scratch(DType::kF32, Shape{1, 8 * 4096});
    Tensor y = *be.Scratch(DType::kF32, Shape{1, 8 * 1024});
    const double t = Time(c, [&] { return be.GroupedLinear(x, w, 8, y); }, y);
    Row(c, "o_a_grouped", "M=1 8x(1024x4096)" + tag, t, 8.0 * 1024 * 4096 * wb, 2.0 * 8 * 1024 * 4096,
        true);
  }
  // The MoE block's experts at one token: 6 routed (distinct) + the shared expert.
  MoeWeights mw;
  mw.gate_up = Rand(c.be, Shape{256, 4096, 4096}, 12, 0.02f, WeightUse::kMatrix);
  mw.down = Rand(c.be, Shape{256, 4096, 2048}, 13, 0.02f, WeightUse::kMatrix);
  mw.shared_gate_up = Rand(c.be, Shape{4096, 4096}, 16, 0.02f, WeightUse::kMatrix);
  mw.shared_down = Rand(c.be, Shape{4096, 2048}, 17, 0.02f, WeightUse::kMatrix);
  Meta(c.be, &meta, 1, 100, 1, 128);
  const std::vector<int32_t> ids = {3, 77, 140, 9, 201, 255};
  Tensor idx = *be.Scratch(DType::kI32, Shape{1, 6});
  Tensor wts = Rand(c.be, Shape{1, 6}, 18, 1.0f);
  (void)be.CopyFromHost(ids.data(), idx);
  Tensor u = *be.Scratch(DType::kF32, Shape{1, 4096}), out = *be.Scratch(DType::kF32, Shape{1, 4096});
  const double t = Time(c, [&] { return be.MoeExperts(u, idx, wts, mw, 10.0f, out); }, out);
  Row(c, "moe_experts+shared", "T=1 6 routed + 1 shared" + tag, t, 7 * 3.0 * 4096 * 2048 * wb,
      7 * 6.0 * 4096 * 2048, true);
}

// ---- FP8 block-scaled weights (kernels/cuda/fp8_linear.h) ----

// A DSV4-Flash dense projection as the release stores it: e4m3 codes, one fp32 scale per
// 128 x 128 block (restarting at every part of part_rows rows); groups > 1: the grouped product.
struct Fp8Case {
  const char* name;
  int64_t n, k;
  int64_t part_rows = 0;
  int64_t groups = 1;
};

// Random non-NaN codes and power-of-two scales (the checkpoint's UE8M0), built on the host.
Tensor Fp8Weight(Backend* be, const Fp8Case& fc, uint64_t seed) {
  StoredWeight sw;
  sw.name = fc.name;
  sw.format = WeightFormat::kFp8Block;
  sw.shape = Shape{fc.n, fc.k};
  sw.block_rows = sw.block_cols = 128;
  sw.part_rows = fc.part_rows;
  sw.data.resize(static_cast<size_t>(fc.n * fc.k));
  uint64_t state = seed;
  for (size_t i = 0; i < sw.data.size(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // 64-bit LCG
    const uint8_t code = static_cast<uint8_t>(state >> 56);
    sw.data[i] = (code & 0x7f) == 0x7f ? code ^ 1 : code;  // 0x7f / 0xff are NaN
  }
  sw.scale_f32.resize(static_cast<size_t>(sw.fp8().ScaleCount()));
  for (size_t i = 0; i < sw.scale_f32.size(); ++i) {
    sw.scale_f32[i] = std::ldexp(1.0f, -8 - static_cast<int>(i % 4));
  }
  auto t = be->CreateStoredWeight(sw, WeightUse::kMatrix);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    std::exit(1);
  }
  return *t;
}

// The Flash projections with FP8 weights at batch 1 and 8 (m <= 8: Fp8Gemv), each next to the
// same product with the backend's dense weights (bf16: the single-token RowGemv at M=1, cuBLASLt
// at M=8). GB/s and %HBM count the weight bytes once (FP8: codes + scales; dense: wb per element).
void Fp8Rows(Ctx& c, const char* dense_tag, double wb) {
  Backend& be = *c.be;
  StepMeta meta;
  Meta(c.be, &meta, 1, 0, 1, 128);
  uint64_t seed = 100;
  for (const Fp8Case& fc : std::vector<Fp8Case>{{"wq_a", 1024, 4096},
                                                {"wq_b", 32768, 1024},
                                                {"wkv", 512, 4096},
                                                {"wo_a_grouped", 8 * 1024, 4096, 0, 8},
                                                {"wo_b", 4096, 8192},
                                                {"idx_wq_b", 8192, 1024},
                                                {"shared_gate_up", 4096, 4096, 2048},
                                                {"shared_down", 4096, 2048}}) {
    const Tensor w8 = Fp8Weight(c.be, fc, ++seed);
    const Tensor wd = Rand(c.be, Shape{fc.n, fc.k}, seed, 0.02f, WeightUse::kMatrix);
    const double fp8_bytes = fc.n * fc.k + ((fc.n + 127) / 128) * ((fc.k + 127) / 128) * 4.0;
    for (int64_t m : {1, 8}) {
      Meta(c.be, &meta, 1, 0, 1, 128);
      Tensor x = *be.Scratch(DType::kF32, Shape{m, fc.groups * fc.k});
      Tensor y = *be.Scratch(DType::kF32, Shape{m, fc.n});
      auto product = [&](const Tensor& w) {
        return [&, w] {
          return fc.groups > 1 ? be.GroupedLinear(x, w, fc.groups, y) : be.Linear(x, w, y);
        };
      };
      const std::string shape = "M=" + std::to_string(m) + " N=" + std::to_string(fc.n) +
                                " K=" + std::to_string(fc.k);
      const double flops = 2.0 * m * fc.n * fc.k;
      Row(c, fc.name, shape + " [fp8]", Time(c, product(w8), y), fp8_bytes, flops, true);
      Row(c, fc.name, shape + " [" + dense_tag + "]", Time(c, product(wd), y), fc.n * fc.k * wb,
          flops, true);
    }
  }
}

// ---- MoE with MXFP4 routed experts (the release's format, kernels/cuda/moe_quant.h) ----
//
// Flash shapes: 256 experts, top-6, D = 4096, I = 2048, random e2m1 codes and UE8M0 scales
// (2^-8 .. 2^-4). GB/s counts the quantised bytes each call must read at least once: the codes
// and scales of the distinct experts its tokens touch (+ the bf16 shared expert where present),
// against the HBM ceiling above; the bf16 experts' rows (moe_experts) are the comparison.

// A random MXFP4 matrix of `shape` (rows = all dims but the last): splitmix64 bytes, fast for
// the 3 GiB of Flash's experts.
StoredWeight RandomMxfp4(Shape shape, uint64_t seed) {
  StoredWeight w;
  w.name = "bench.mxfp4";
  w.format = WeightFormat::kMxfp4;
  w.shape = shape;
  uint64_t state = seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  w.data.resize(static_cast<size_t>(shape.numel() / 2));
  for (size_t i = 0; i < w.data.size(); i += 8) {
    const uint64_t r = next();
    std::memcpy(w.data.data() + i, &r, std::min<size_t>(8, w.data.size() - i));
  }
  w.scale_e8m0.resize(static_cast<size_t>(shape.numel() / 32));
  for (auto& b : w.scale_e8m0) b = static_cast<uint8_t>(119 + next() % 5);
  return w;
}

// `bf16_rows`: the bf16 experts' rows too, at the same routing (--moe-quant-only, where the
// general MoE section does not run).
void QuantMoeRows(Ctx& c, double wb, bool bf16_rows) {
  Backend& be = *c.be;
  constexpr int64_t E = 256, D = 4096, I = 2048, K = 6;
  auto gate_up = be.CreateStoredWeight(RandomMxfp4(Shape{E, 2 * I, D}, 31), WeightUse::kMatrix);
  auto down = be.CreateStoredWeight(RandomMxfp4(Shape{E, D, I}, 32), WeightUse::kMatrix);
  if (!gate_up.ok() || !down.ok()) {
    std::fprintf(stderr, "MXFP4 experts: %s\n",
                 (gate_up.ok() ? down.status() : gate_up.status()).ToString().c_str());
    std::exit(1);
  }
  // Codes and scales of one expert: 3 D I / 2 bytes of nibbles, 3 D I / 32 of UE8M0.
  const double expert_bytes = 3.0 * D * I / 2 + 3.0 * D * I / 32;
  const MoeWeights routed{*gate_up, *down, Tensor{}, Tensor{}, Tensor{}};
  MoeWeights bf16_experts;
  if (bf16_rows) {
    bf16_experts.gate_up = Rand(c.be, Shape{E, 2 * I, D}, 12, 0.02f, WeightUse::kMatrix);
    bf16_experts.down = Rand(c.be, Shape{E, D, I}, 13, 0.02f, WeightUse::kMatrix);
  }
  MoeWeights with_shared = routed;
  with_shared.shared_gate_up = Rand(c.be, Shape{2 * I, D}, 33, 0.02f, WeightUse::kMatrix);
  with_shared.shared_down = Rand(c.be, Shape{D, I}, 34, 0.02f, WeightUse::kMatrix);
  StepMeta meta;
  for (int32_t T : {1, 8, 64, 256, 512, 1024, 2048, 8192}) {
    // Decode batches: T sequences of one token; prefills: one sequence of T (512: 12
    // assignments an expert, 1024: 24, the streaming kernels' (moe_stream.h); 2048: 48 and
    // 8192: 192, the tiled GEMMs', whose TFLOP/s column is the prefill line's).
    if (T <= 256) {
      Meta(c.be, &meta, T, 100, 1, 128);
    } else {
      Meta(c.be, &meta, 1, 0, T, 128);
    }
    // Distinct random experts per token (the bf16 rows' routing).
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::mt19937 rng(15);
    for (int32_t t = 0; t < T; ++t) {
      std::vector<int32_t> e(E);
      std::iota(e.begin(), e.end(), 0);
      std::shuffle(e.begin(), e.end(), rng);
      std::copy(e.begin(), e.begin() + K, ids.begin() + t * K);
    }
    int distinct = 0;
    {
      std::vector<char> seen(E, 0);
      for (int32_t e : ids) distinct += seen[e] ? 0 : (seen[e] = 1);
    }
    Tensor idx = *be.Scratch(DType::kI32, Shape{T, K});
    Tensor wts = Rand(c.be, Shape{T, K}, 35, 1.0f);
    (void)be.CopyFromHost(ids.data(), idx);
    // Random activations: zeros would run the tensor cores faster than real data does.
    Tensor u = Rand(c.be, Shape{T, D}, 36 + T, 1.0f), out = *be.Scratch(DType::kF32, Shape{T, D});
    const std::string sh = "T=" + std::to_string(T) + " distinct=" + std::to_string(distinct);
    double t = Time(c, [&] { return be.MoeExperts(u, idx, wts, routed, 10.0f, out); }, out);
    Row(c, "moe_mxfp4", sh, t, distinct * expert_bytes, 6.0 * T * K * D * I, wb == 2);
    if (bf16_rows) {
      t = Time(c, [&] { return be.MoeExperts(u, idx, wts, bf16_experts, 10.0f, out); }, out);
      Row(c, "moe_experts", sh, t, distinct * 3.0 * D * I * wb, 6.0 * T * K * D * I, wb == 2);
    }
    if (T == 1) {
      t = Time(c, [&] { return be.MoeExperts(u, idx, wts, with_shared, 10.0f, out); }, out);
      Row(c, "moe_mxfp4+shared", sh + " + shared", t,
          distinct * expert_bytes + 3.0 * D * I * wb, 6.0 * (K + 1) * D * I, wb == 2);
    }
  }
}

int Main(int argc, char** argv) {
  Ctx c;
  Precision prec = Precision::kBF16;
  bool decode_only = false, fp8_only = false, moe_quant_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) c.iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--warmup-ms") && i + 1 < argc) {
      c.warmup_ms = std::max(0.0, std::atof(argv[++i]));
    }
    else if (!std::strcmp(argv[i], "--precision") && i + 1 < argc) {
      auto p = ParsePrecision(argv[++i]);
      if (!p.ok()) return std::fprintf(stderr, "%s\n", p.status().ToString().c_str()), 2;
      prec = *p;
    } else if (!std::strcmp(argv[i], "--decode-only")) {
      decode_only = true;
    } else if (!std::strcmp(argv[i], "--fp8-only")) {
      fp8_only = true;
    } else if (!std::strcmp(argv[i], "--moe-quant-only")) {
      moe_quant_only = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--iters N] [--warmup-ms T] [--precision bf16|fp32] "
                   "[--decode-only | --fp8-only | --moe-quant-only]\n",
                   argv[0]);
      return 2;
    }
  }
  auto backend = CreateCudaBackend(0, prec);
  if (!backend.ok()) return std::fprintf(stderr, "%s\n", backend.status().ToString().c_str()), 1;
  c.be = backend->get();
  Backend& be = *c.be;
  const double wb = prec == Precision::kBF16 ? 2 : 4;
  StepMeta meta;

  // For reference: y = a + b over 1 GiB arrays (3 GiB moved).
  {
    Meta(c.be, &meta, 1, 0, 1, 128);
    const int64_t n = 1 << 28;
    Tensor a = Rand(c.be, Shape{n}, 1, 1), b = Rand(c.be, Shape{n}, 2, 1);
    Tensor y = *be.CreatePool(DType::kF32, Shape{n});
    const double t = Time(c, [&] { return be.Add(a, b, y); }, y);
    std::printf("streaming add (the backend's Add, 3 GiB moved): %.0f GB/s; %%HBM is of %.1f TB/s\n",
                3.0 * n * 4 / t / 1e9, c.hbm / 1e12);
  }
  std::printf("precision=%s iters=%d warmup-ms=%g\n", PrecisionName(prec), c.iters, c.warmup_ms);
  std::printf("%-18s %-34s %10s %10s %8s %9s %8s\n", "op", "shape", "us/call", "GB/s", "%HBM",
              "TFLOP/s", "%bf16");
  if (moe_quant_only) {
    QuantMoeRows(c, wb, true);
    return 0;
  }

  // FP8 weights against dense ones at the Flash projection shapes, batch 1 and 8.
  Fp8Rows(c, prec == Precision::kBF16 ? "bf16" : "fp32", wb);
  if (fp8_only) return 0;

  // Batch-1 decode products side by side: the single-token kernels against the general paths
  // (cuBLASLt / split-K GEMV / sorted grouped experts + separate shared expert) they replaced,
  // the latter on a second backend made with DSV4_ROW_GEMV=0.
  if (prec == Precision::kBF16) {
    setenv("DSV4_ROW_GEMV", "0", 1);
    auto baseline = CreateCudaBackend(0, prec);
    unsetenv("DSV4_ROW_GEMV");
    if (!baseline.ok()) return std::fprintf(stderr, "%s\n", baseline.status().ToString().c_str()), 1;
    Ctx b = c;
    b.be = baseline->get();
    DecodeRows(b, "general", wb);
    baseline->reset();
    DecodeRows(c, "row-gemv", wb);
  }
  if (decode_only) return 0;

  // GEMMs of a decode/prefill step (weights dominate the bytes).
  for (const G& g : std::vector<G>{{"q_a_proj", 1024, 4096},
                                   {"q_b_proj", 32768, 1024},
                                   {"kv_proj", 512, 4096},
                                   {"o_b_proj", 4096, 8192},
                                   {"lm_head", 129280, 4096}}) {
    Tensor w = Rand(c.be, Shape{g.n, g.k}, 3, 0.02f, WeightUse::kMatrix);
    for (int64_t m : {1, 8, 64, 256, 2048}) {
      Meta(c.be, &meta, 1, 0, 1, 128);
      Tensor x = *be.Scratch(DType::kF32, Shape{m, g.k});
      Tensor y = *be.Scratch(DType::kF32, Shape{m, g.n});
      const double t = Time(c, [&] { return be.Linear(x, w, y); }, y);
      Row(c, g.name, "M=" + std::to_string(m) + " N=" + std::to_string(g.n) + " K=" + std::to_string(g.k), t,
          g.n * g.k * wb + m * (g.k + g.n) * 4.0, 2.0 * m * g.n * g.k, prec == Precision::kBF16);
    }
  }
  {
    Tensor w = Rand(c.be, Shape{8 * 1024, 4096}, 4, 0.02f, WeightUse::kMatrix);
    for (int64_t m : {1, 8, 64, 256}) {
      Meta(c.be, &meta, 1, 0, 1, 128);
      Tensor x = *be.Scratch(DType::kF32, Shape{m, 8 * 4096});
      Tensor y = *be.Scratch(DType::kF32, Shape{m, 8 * 1024});
      const double t = Time(c, [&] { return be.GroupedLinear(x, w, 8, y); }, y);
      Row(c, "o_a_grouped", "M=" + std::to_string(m) + " 8x(1024x4096)", t,
          8.0 * 1024 * 4096 * wb + m * (8 * 4096 + 8 * 1024) * 4.0, 2.0 * m * 8 * 1024 * 4096,
          prec == Precision::kBF16);
    }
  }

  // Norms, RoPE, mHC at batch sizes.
  Tensor inv = Rand(c.be, Shape{32}, 5, 0.5f);
  Tensor fn = Rand(c.be, Shape{24, 4 * 4096}, 6, 0.008f), base = Rand(c.be, Shape{24}, 7, 0.1f);
  Tensor scale = Rand(c.be, Shape{3}, 8, 1.0f), normw = Rand(c.be, Shape{4096}, 9, 1.0f);
  for (int32_t T : {1, 64, 256}) {
    Meta(c.be, &meta, T, 1000, 1, 128);
    const std::string sh = "T=" + std::to_string(T);
    Tensor x = *be.Scratch(DType::kF32, Shape{T, 4096}), y = *be.Scratch(DType::kF32, Shape{T, 4096});
    double t = Time(c, [&] { return be.RmsNorm(x, normw, RmsNormParams{}, y); }, y);
    Row(c, "rms_norm", sh + " D=4096", t, 2.0 * T * 4096 * 4, 0, false);
    Tensor q = *be.Scratch(DType::kF32, Shape{T, 64, 512});
    RopeParams rp;
    rp.rope_dims = 64;
    rp.inv_freq = inv;
    t = Time(c, [&] { return be.Rope(q, rp); }, q);
    Row(c, "rope", sh + " 64x512 rd=64", t, 2.0 * T * 64 * 64 * 4, 0, false);
    Tensor hs = *be.Scratch(DType::kF32, Shape{T, 4, 4096}), hs2 = *be.Scratch(DType::kF32, Shape{T, 4, 4096});
    Tensor post = *be.Scratch(DType::kF32, Shape{T, 4}), comb = *be.Scratch(DType::kF32, Shape{T, 4, 4});
    HcParams hp;
    t = Time(c, [&] { return be.HcPre(hs, fn, base, scale, hp, y, post, comb); }, y);
    Row(c, "hc_pre", sh + " n=4 D=4096", t, T * 4.0 * 4096 * 4 + 24.0 * 4 * 4096 * 4, 2.0 * T * 24 * 4 * 4096, false);
    t = Time(c, [&] { return be.HcPost(hs, x, post, comb, hs2); }, hs2);
    Row(c, "hc_post", sh + " n=4 D=4096", t, T * 9.0 * 4096 * 4, 0, false);
  }

  // Attention, indexer and compressors at decode (batch x context).
  const int64_t H = 64, hd = 512, W = 128;
  for (int32_t B : {1, 8, 64}) {
    for (int32_t ctx : {1024, 16384, 65536}) {
      Meta(c.be, &meta, B, ctx, 1, 128);
      const int64_t blocks = int64_t{B} * meta.block_stride;
      const std::string sh = "B=" + std::to_string(B) + " ctx=" + std::to_string(ctx);
      Tensor q = *be.Scratch(DType::kF32, Shape{B, H, hd}), kv = *be.Scratch(DType::kF32, Shape{B, hd});
      Tensor o = *be.Scratch(DType::kF32, Shape{B, H, hd});
      Tensor ring = *be.CreatePool(DType::kF32, Shape{B, W, hd});
      Tensor sinks = Rand(c.be, Shape{H}, 10, 0.1f);
      // CSA: the indexer over ctx/4 candidates (top-512), then attention over window + 512.
      Tensor keys = *be.CreatePool(DType::kF32, Shape{blocks, 32, 128});
      Tensor qi = *be.Scratch(DType::kF32, Shape{B, 64, 128}), wi = *be.Scratch(DType::kF32, Shape{B, 64});
      Tensor sel = *be.Scratch(DType::kI32, Shape{B, 512});
      IndexerParams ip;
      ip.ratio = 4;
      ip.topk = 512;
      double t = Time(c, [&] { return be.IndexerTopK(ip, qi, wi, keys, sel); }, qi);
      const double cand = (ctx + 1) / 4;
      Row(c, "indexer_topk512", sh, t, B * cand * 128 * 4.0, 2.0 * B * cand * 64 * 128, false);
      Tensor entries4 = *be.CreatePool(DType::kF32, Shape{blocks, 32, hd});
      AttentionParams ap;
      ap.window = W;
      ap.ratio = 4;
      ap.scale = 0.044f;
      t = Time(c, [&] { return be.Attention(ap, q, kv, ring, entries4, sel, sinks, o); }, o);
      Row(c, "attention_csa", sh + " W=128+512", t, B * (W + 512.0) * hd * 4 + 2.0 * B * H * hd * 4,
          4.0 * B * H * (W + 512) * hd, false);
      Tensor entries128 = *be.CreatePool(DType::kF32, Shape{blocks, 1, hd});
      ap.ratio = 128;
      ap.dense_compressed = true;
      t = Time(c, [&] { return be.Attention(ap, q, kv, ring, entries128, Tensor{}, sinks, o); }, o);
      const double hca = (ctx + 1) / 128;
      Row(c, "attention_hca", sh + " W=128+ctx/128", t,
          B * (W + hca) * hd * 4 + 2.0 * B * H * hd * 4, 4.0 * B * H * (W + hca) * hd, false);
      // Compressor step (CSA main: m=4, c=2, d=512).
      CompressParams cp;
      cp.ratio = 4;
      cp.overlap = 2;
      cp.dim = 512;
      cp.position_bias = Rand(c.be, Shape{4, 1024}, 11, 0.1f);
      cp.norm_weight = normw.View(Shape{512});
      cp.rope.rope_dims = 64;
      cp.rope.inv_freq = inv;
      Tensor state = *be.CreatePool(DType::kF32, Shape{B, CompressStateFloats(4, 2, 512)});
      Tensor a = *be.Scratch(DType::kF32, Shape{B, 1024}), z = *be.Scratch(DType::kF32, Shape{B, 1024});
      if (ctx == 1024) {
        t = Time(c, [&] { return be.Compress(cp, a, z, state, entries4); }, a);
        Row(c, "compress_csa", "B=" + std::to_string(B) + " m=4 c=2 d=512", t,
            B * CompressStateFloats(4, 2, 512) * 4.0 * 2, 0, false);
      }
    }
  }

  // MoE: router and grouped experts at Flash width (256 experts, top-6, 4096 x 2048).
  {
    Tensor gate_up = Rand(c.be, Shape{256, 4096, 4096}, 12, 0.02f, WeightUse::kMatrix);
    Tensor down = Rand(c.be, Shape{256, 4096, 2048}, 13, 0.02f, WeightUse::kMatrix);
    Tensor bias = Rand(c.be, Shape{256}, 14, 0.01f);
    for (int32_t T : {1, 8, 64, 256}) {
      Meta(c.be, &meta, T, 100, 1, 128);
      const std::string sh = "T=" + std::to_string(T);
      Tensor logits = *be.Scratch(DType::kF32, Shape{T, 256});
      Tensor idx = *be.Scratch(DType::kI32, Shape{T, 6}), wts = *be.Scratch(DType::kF32, Shape{T, 6});
      RouterParams rp;
      rp.top_k = 6;
      // Distinct random experts per token.
      std::vector<int32_t> ids(T * 6);
      std::mt19937 rng(15);
      for (int32_t t = 0; t < T; ++t) {
        std::vector<int32_t> e(256);
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.end(), rng);
        std::copy(e.begin(), e.begin() + 6, ids.begin() + t * 6);
      }
      double t = Time(c, [&] { return be.Route(rp, logits, bias, Tensor{}, idx, wts); }, wts);
      Row(c, "router", sh + " E=256 K=6", t, T * 256 * 4.0, 0, false);
      (void)be.CopyFromHost(ids.data(), idx);
      int distinct = 0;
      {
        std::vector<char> seen(256, 0);
        for (int32_t e : ids) distinct += seen[e] ? 0 : (seen[e] = 1);
      }
      Tensor u = *be.Scratch(DType::kF32, Shape{T, 4096}), out = *be.Scratch(DType::kF32, Shape{T, 4096});
      const MoeWeights mw{gate_up, down, Tensor{}, Tensor{}, Tensor{}};
      t = Time(c, [&] { return be.MoeExperts(u, idx, wts, mw, 10.0f, out); }, out);
      Row(c, "moe_experts", sh + " distinct=" + std::to_string(distinct), t,
          distinct * 3.0 * 4096 * 2048 * wb, 6.0 * T * 6 * 4096 * 2048, prec == Precision::kBF16);
    }
  }
  QuantMoeRows(c, wb, false);
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::Main(argc, argv); }
