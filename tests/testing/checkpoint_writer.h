// Test utilities: write safetensors files and build synthetic DSV4 checkpoints of any config.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/json_util.h"
#include "common/model_config.h"

namespace dsv4::testing {

struct NamedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

NamedTensor F32Tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& v);
NamedTensor I64Tensor(std::string name, std::vector<int64_t> shape, const std::vector<int64_t>& v);

// Serialises tensors (header + data, 8-byte aligned) into a safetensors image.
std::vector<uint8_t> SafetensorsBytes(const std::vector<NamedTensor>& tensors);
void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes);
void WriteFile(const std::string& path, const std::string& text);

enum class Naming {
  kFixture,   // official names with a `model.` prefix, `head.weight` (transformers save_pretrained)
  kOfficial,  // official release names, no prefix
  kHf,        // HF in-memory names with fused experts
};

// Deterministic random weights for `config`, named per `naming`.
std::vector<NamedTensor> SyntheticCheckpoint(const ModelConfig& config, uint64_t seed,
                                             Naming naming);

// The dsv4-tiny fixture config as JSON (tests/data), for tests to modify.
Json TinyConfigJson();
// A 3-layer model (sliding + hash MoE, CSA + MoE, HCA + MoE) at the real DSV4-Flash attention
// widths: hidden 4096, 64 heads x 512, q_lora 1024, o_groups 8 x 1024, indexer 64 x 128, ratios 4
// and 128, window 128, hc_mult 4, top-6 of 16 experts. The indexer top-k, expert width and
// vocabulary are the caller's (kept small, the CPU reference stays quick).
Json FlashWidthsConfigJson(int index_topk, int moe_intermediate_size, int vocab_size);
// Temporary directory unique to the test; removed by the OS/CI workspace.
std::string TempDir(const std::string& name);
// Writes config.json + model.safetensors for `config_json` into a fresh directory.
std::string WriteSyntheticModel(const std::string& name, const Json& config_json, uint64_t seed,
                                Naming naming = Naming::kFixture);

// A model whose head.weight is finite but so large (±3e38, a random sign per element) that every
// step's logits overflow to Inf or NaN: what a broken-but-loadable checkpoint does at run time.
std::string WriteOverflowingModel(const std::string& name, const Json& config_json, uint64_t seed);

// Absolute path of tests/data/<rel>.
std::string TestData(const std::string& rel);

}  // namespace dsv4::testing
