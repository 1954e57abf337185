#include "tests/testing/checkpoint_writer.h"

#include <cstdlib>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace dsv4::testing {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float Uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  std::vector<float> Vec(int64_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = Uniform(lo, hi);
    return v;
  }
  int64_t Int(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(gen_); }

 private:
  std::mt19937_64 gen_;
};

}  // namespace

NamedTensor F32Tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
  NamedTensor t{std::move(name), DType::kF32, std::move(shape), {}};
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

NamedTensor I64Tensor(std::string name, std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  NamedTensor t{std::move(name), DType::kI64, std::move(shape), {}};
  t.bytes.resize(v.size() * 8);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

std::vector<uint8_t> SafetensorsBytes(const std::vector<NamedTensor>& tensors) {
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> out(8);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

void WriteFile(const std::string& path, const std::string& text) {
  WriteFile(path, std::vector<uint8_t>(text.begin(), text.end()));
}

std::vector<NamedTensor> SyntheticCheckpoint(const ModelConfig& c, uint64_t seed, Naming naming) {
  Rng rng(seed);
  std::vector<NamedTensor> out;
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, n = c.hc_mult;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const std::string top = naming == Naming::kOfficial ? "" : "model.";
  auto lin = [&](int64_t out_dim, int64_t in_dim) {
    const float a = 1.0f / std::sqrt(static_cast<float>(in_dim));
    return rng.Vec(out_dim * in_dim, -a, a);
  };
  auto norm = [&](int64_t d) { return rng.Vec(d, 0.8f, 1.2f); };
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    out.push_back(F32Tensor(name, std::move(shape), v));
  };
  const bool hf = naming == Naming::kHf;
  add(hf ? "model.embed_tokens.weight" : (naming == Naming::kOfficial ? "embed.weight"
                                                                      : "model.embed_tokens.weight"),
      {c.vocab_size, D}, rng.Vec(c.vocab_size * D, -1, 1));
  add(hf ? "lm_head.weight" : "head.weight", {c.vocab_size, D}, lin(c.vocab_size, D));
  add(top + "norm.weight", {D}, norm(D));
  const std::string hc_head = hf || naming == Naming::kFixture ? "model.hc_head.hc_" : "hc_head_";
  add(hc_head + "fn", {n, n * D}, rng.Vec(n * n * D, -0.05f, 0.05f));
  add(hc_head + "base", {n}, rng.Vec(n, -0.5f, 0.5f));
  add(hc_head + "scale", {1}, rng.Vec(1, 0.5f, 1.5f));
  const int64_t mix = c.HcMixDim();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat(top, "layers.", l, ".");
    auto name = [&](const std::string& official, const std::string& hf_name) {
      return p + (hf ? hf_name : official);
    };
    add(name("attn_norm.weight", "input_layernorm.weight"), {D}, norm(D));
    add(name("ffn_norm.weight", "post_attention_layernorm.weight"), {D}, norm(D));
    for (const char* which : {"attn", "ffn"}) {
      add(hf ? absl::StrCat(p, which, "_hc.fn") : absl::StrCat(p, "hc_", which, "_fn"),
          {mix, n * D}, rng.Vec(mix * n * D, -0.05f, 0.05f));
      add(hf ? absl::StrCat(p, which, "_hc.base") : absl::StrCat(p, "hc_", which, "_base"), {mix},
          rng.Vec(mix, -0.5f, 0.5f));
      add(hf ? absl::StrCat(p, which, "_hc.scale") : absl::StrCat(p, "hc_", which, "_scale"), {3},
          rng.Vec(3, 0.5f, 1.5f));
    }
    add(name("attn.wq_a.weight", "self_attn.q_a_proj.weight"), {c.q_lora_rank, D},
        lin(c.q_lora_rank, D));
    add(name("attn.q_norm.weight", "self_attn.q_a_norm.weight"), {c.q_lora_rank},
        norm(c.q_lora_rank));
    add(name("attn.wq_b.weight", "self_attn.q_b_proj.weight"), {H * hd, c.q_lora_rank},
        lin(H * hd, c.q_lora_rank));
    add(name("attn.wkv.weight", "self_attn.kv_proj.weight"), {hd, D}, lin(hd, D));
    add(name("attn.kv_norm.weight", "self_attn.kv_norm.weight"), {hd}, norm(hd));
    const int64_t G = c.o_groups, R = c.o_lora_rank;
    add(name("attn.wo_a.weight", "self_attn.o_a_proj.weight"), {G * R, (H / G) * hd},
        lin(G * R, (H / G) * hd));
    add(name("attn.wo_b.weight", "self_attn.o_b_proj.weight"), {D, G * R}, lin(D, G * R));
    add(name("attn.attn_sink", "self_attn.sinks"), {H}, rng.Vec(H, -1, 1));
    const AttnType type = c.layer_types[l];
    const int64_t m = c.Ratio(l);
    auto compressor = [&](const std::string& official, const std::string& hf_prefix, int64_t cd,
                          int64_t d) {
      add(name(official + "wkv.weight", hf_prefix + "kv_proj.weight"), {cd, D}, lin(cd, D));
      add(name(official + "wgate.weight", hf_prefix + "gate_proj.weight"), {cd, D}, lin(cd, D));
      add(name(official + "ape", hf_prefix + "position_bias"), {m, cd}, rng.Vec(m * cd, -1, 1));
      add(name(official + "norm.weight", hf_prefix + "kv_norm.weight"), {d}, norm(d));
    };
    if (type != AttnType::kSliding) {
      const int64_t c2 = type == AttnType::kCsa ? 2 : 1;
      compressor("attn.compressor.", "self_attn.compressor.", c2 * hd, hd);
    }
    if (type == AttnType::kCsa) {
      const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
      compressor("attn.indexer.compressor.", "self_attn.compressor.indexer.", 2 * dI, dI);
      add(name("attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
          {nI * dI, c.q_lora_rank}, lin(nI * dI, c.q_lora_rank));
      add(name("attn.indexer.weights_proj.weight",
               "self_attn.compressor.indexer.scorer.weights_proj.weight"),
          {nI, D}, lin(nI, D));
    }
    add(name("ffn.gate.weight", "mlp.gate.weight"), {E, D}, lin(E, D));
    if (c.mlp_types[l] == MlpType::kHashMoe) {
      std::vector<int64_t> table(c.vocab_size * K);
      for (auto& e : table) e = rng.Int(E);
      out.push_back(I64Tensor(name("ffn.gate.tid2eid", "mlp.gate.tid2eid"), {c.vocab_size, K}, table));
    } else {
      add(name("ffn.gate.bias", "mlp.gate.e_score_correction_bias"), {E}, rng.Vec(E, -0.3f, 0.3f));
    }
    if (hf) {
      std::vector<float> gu, down;
      for (int64_t e = 0; e < E; ++e) {
        auto g = lin(2 * I, D);
        gu.insert(gu.end(), g.begin(), g.end());
        auto d = lin(D, I);
        down.insert(down.end(), d.begin(), d.end());
      }
      add(p + "mlp.experts.gate_up_proj", {E, 2 * I, D}, gu);
      add(p + "mlp.experts.down_proj", {E, D, I}, down);
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = absl::StrCat(p, "ffn.experts.", e, ".");
        add(ep + "w1.weight", {I, D}, lin(I, D));
        add(ep + "w3.weight", {I, D}, lin(I, D));
        add(ep + "w2.weight", {D, I}, lin(D, I));
      }
    }
    add(name("ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"), {I, D}, lin(I, D));
    add(name("ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"), {I, D}, lin(I, D));
    add(name("ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"), {D, I}, lin(D, I));
  }
  return out;
}

std::string TestData(const std::string& rel) {
  // $DSV4_TEST_DATA_DIR overrides the build-time path (test binaries bundled for the GPU host).
  const char* env = std::getenv("DSV4_TEST_DATA_DIR");
  return absl::StrCat(env != nullptr ? env : DSV4_TEST_DATA_DIR, "/", rel);
}

Json TinyConfigJson() {
  auto text = ReadFileToString(TestData("dsv4-tiny/config.json"), 1 << 20);
  if (!text.ok()) throw std::runtime_error(text.status().ToString());
  auto json = ParseJson(*text, "config.json");
  if (!json.ok()) throw std::runtime_error(json.status().ToString());
  return *json;
}

Json FlashWidthsConfigJson(int index_topk, int moe_intermediate_size, int vocab_size) {
  Json j = TinyConfigJson();
  j["hidden_size"] = 4096;
  j["num_attention_heads"] = 64;
  j["head_dim"] = 512;
  j["qk_rope_head_dim"] = 64;
  j["partial_rotary_factor"] = 0.125;
  j["rope_parameters"]["main"]["partial_rotary_factor"] = 0.125;
  j["rope_parameters"]["compress"]["partial_rotary_factor"] = 0.125;
  j["q_lora_rank"] = 1024;
  j["o_groups"] = 8;
  j["o_lora_rank"] = 1024;
  j["index_n_heads"] = 64;
  j["index_head_dim"] = 128;
  j["index_topk"] = index_topk;
  j["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  j["sliding_window"] = 128;
  j["n_routed_experts"] = 16;
  j["num_experts_per_tok"] = 6;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["hc_mult"] = 4;
  j["vocab_size"] = vocab_size;
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"sliding_attention", "compressed_sparse_attention",
                      "heavily_compressed_attention"};
  j["mlp_layer_types"] = {"hash_moe", "moe", "moe"};
  return j;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root = base != nullptr ? base : "/tmp";
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info != nullptr ? info->name() : "x";
  for (char& ch : test) {
    if (ch == '/') ch = '_';
  }
  std::string dir = absl::StrCat(root, "/dsv4_", ::getpid(), "_", test, "_", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string WriteSyntheticModel(const std::string& name, const Json& config_json, uint64_t seed,
                                Naming naming) {
  const std::string dir = TempDir(name);
  WriteFile(dir + "/config.json", config_json.dump(2));
  auto config = ParseModelConfig(config_json.dump());
  if (!config.ok()) throw std::runtime_error(config.status().ToString());
  WriteFile(dir + "/model.safetensors",
            SafetensorsBytes(SyntheticCheckpoint(*config, seed, naming)));
  return dir;
}

std::string WriteOverflowingModel(const std::string& name, const Json& config_json, uint64_t seed) {
  auto config = ParseModelConfig(config_json.dump());
  if (!config.ok()) return "";
  std::vector<NamedTensor> tensors = SyntheticCheckpoint(*config, seed, Naming::kFixture);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (NamedTensor& t : tensors) {
    if (t.name != "head.weight" && t.name != "model.head.weight") continue;
    for (size_t i = 0; i + 4 <= t.bytes.size(); i += 4) {
      const float v = (rng() & 1) ? 3e38f : -3e38f;
      std::memcpy(t.bytes.data() + i, &v, 4);
    }
  }
  const std::string dir = TempDir(name);
  WriteFile(dir + "/config.json", config_json.dump());
  WriteFile(dir + "/model.safetensors", SafetensorsBytes(tensors));
  return dir;
}

}  // namespace dsv4::testing
