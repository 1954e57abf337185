// What the load-time finite check costs (issue #18 finding 8): WeightSource::F32 converts a
// checkpoint tensor to fp32 and then scans it for NaN/Inf. This times the whole call and the scan
// alone on BF16 and FP8 (128x128 block-scaled) tensors of a Flash expert-matrix size, one core.
//   build/bench/dsv4_weight_load_bench [rows cols repeats]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/checkpoint_writer.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/weight_source.h"

using dsv4::testing::NamedTensor;

namespace {

double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 7168;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  std::mt19937 rng(1);
  NamedTensor bf16{"layers.0.attn.wq_b.weight", dsv4::DType::kBF16, {rows, cols}, {}};
  bf16.bytes.resize(static_cast<size_t>(rows * cols * 2));
  for (size_t i = 0; i < bf16.bytes.size(); i += 2) {
    const uint16_t v = dsv4::F32ToBf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    bf16.bytes[i] = static_cast<uint8_t>(v);
    bf16.bytes[i + 1] = static_cast<uint8_t>(v >> 8);
  }
  NamedTensor fp8{"layers.0.attn.wo_b.weight", dsv4::DType::kF8E4M3, {rows, cols}, {}};
  fp8.bytes.resize(static_cast<size_t>(rows * cols));
  for (auto& b : fp8.bytes) b = static_cast<uint8_t>(rng() & 0x77);  // finite e4m3 values
  const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  NamedTensor scale{"layers.0.attn.wo_b.scale", dsv4::DType::kF32, {sr, sc}, {}};
  scale.bytes.resize(static_cast<size_t>(sr * sc * 4));
  for (size_t i = 0; i < scale.bytes.size(); i += 4) {
    const float s = 1.0f / 64;
    std::memcpy(scale.bytes.data() + i, &s, 4);
  }
  const std::string dir = dsv4::testing::TempDir("weight-load-bench");
  dsv4::testing::WriteFile(dir + "/model.safetensors",
                           dsv4::testing::SafetensorsBytes({bf16, fp8, scale}));
  auto ckpt = dsv4::Checkpoint::Open(dir);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(ckpt.status().message()).c_str());
    return 1;
  }
  auto src = dsv4::WeightSource::Create(ckpt->get());
  if (!src.ok()) return 1;
  std::printf("tensor %lld x %lld (%.0f M values), best of %d, one core\n",
              static_cast<long long>(rows), static_cast<long long>(cols), rows * cols / 1e6, repeats);
  std::printf("%-6s %12s %12s %10s\n", "dtype", "F32() ms", "scan ms", "scan share");
  for (const char* name : {"model.layers.0.self_attn.q_b_proj.weight",
                           "model.layers.0.self_attn.o_b_proj.weight"}) {
    double best = 1e30, best_scan = 1e30;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto w = src->F32(name, dsv4::Shape{rows, cols});
      best = std::min(best, Seconds(t0));
      if (!w.ok()) {
        std::fprintf(stderr, "error: %s\n", std::string(w.status().message()).c_str());
        return 1;
      }
      t0 = std::chrono::steady_clock::now();
      int64_t bad = 0;
      for (float v : w->f32) bad += !std::isfinite(v);
      best_scan = std::min(best_scan, Seconds(t0));
      if (bad != 0) return 1;
    }
    std::printf("%-6s %12.1f %12.1f %9.1f%%\n", std::string(name).find("q_b") != std::string::npos ? "BF16" : "FP8", best * 1e3,
                best_scan * 1e3, 100 * best_scan / best);
  }
  return 0;
}
