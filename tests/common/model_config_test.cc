#include "common/model_config.h"

#include <cmath>
#include <functional>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

using testing::TinyConfigJson;

ModelConfig ParseOrDie(const Json& j) {
  auto c = ParseModelConfig(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

TEST(ModelConfig, ParsesTheTinyFixture) {
  const ModelConfig c = ParseOrDie(TinyConfigJson());
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_dims, 16);
  EXPECT_EQ(c.sliding_window, 16);
  EXPECT_EQ(c.csa_ratio, 4);
  EXPECT_EQ(c.hca_ratio, 16);
  ASSERT_EQ(c.layer_types.size(), 6u);
  EXPECT_EQ(c.layer_types[1], AttnType::kCsa);
  EXPECT_EQ(c.layer_types[2], AttnType::kHca);
  EXPECT_EQ(c.Ratio(0), 0);
  EXPECT_EQ(c.Ratio(3), 4);
  EXPECT_EQ(c.Ratio(4), 16);
  EXPECT_EQ(c.mlp_types[2], MlpType::kHashMoe);
  EXPECT_EQ(c.mlp_types[3], MlpType::kMoe);
  EXPECT_EQ(c.index_topk, 8);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.HcMixDim(), 24);
  EXPECT_FALSE(c.main_rope.yarn);
  EXPECT_DOUBLE_EQ(c.main_rope.theta, 10000);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.theta, 160000);
  EXPECT_DOUBLE_EQ(c.compress_rope.factor, 4);  // the dict's factor, not 4096/64
  EXPECT_EQ(c.compress_rope.original_max_position, 64);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
}

TEST(ModelConfig, FlashYarnMatchesTheSpec) {
  auto c = LoadModelConfig(testing::TestData("configs/dsv4-flash.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 43);
  EXPECT_EQ(c->layer_types[0], AttnType::kSliding);
  EXPECT_EQ(c->layer_types[2], AttnType::kCsa);
  EXPECT_EQ(c->layer_types[3], AttnType::kHca);
  EXPECT_EQ(c->rope_dims, 64);
  // dsv4-model.md §2.3: for rd=64, base 160000, orig 65536: pairs 0..15 unchanged, 25..31
  // divided by 16, a linear blend in between.
  const auto plain = RopeInvFreq(RopeConfig{160000.0}, 64);
  const auto yarn = RopeInvFreq(c->compress_rope, 64);
  ASSERT_EQ(yarn.size(), 32u);
  for (int p = 0; p <= 15; ++p) EXPECT_FLOAT_EQ(yarn[p], plain[p]) << p;
  for (int p = 25; p < 32; ++p) EXPECT_FLOAT_EQ(yarn[p], plain[p] / 16) << p;
  const float ramp = (20.0f - 15.0f) / 10.0f;
  EXPECT_NEAR(yarn[20], plain[20] * (1 - ramp) + plain[20] / 16 * ramp, 1e-12);
  const auto main = RopeInvFreq(c->main_rope, 64);
  EXPECT_FLOAT_EQ(main[0], 1.0f);
  EXPECT_NEAR(main[1], std::pow(10000.0, -2.0 / 64), 1e-7);
}

TEST(ModelConfig, LegacyKeys) {
  Json j = TinyConfigJson();
  j.erase("layer_types");
  j.erase("mlp_layer_types");
  j.erase("compress_rates");
  j.erase("partial_rotary_factor");
  j.erase("rope_parameters");
  j["compress_ratios"] = {0, 8, 32, 8, 32, 0, 0};  // one extra entry (MTP) is dropped
  j["compress_rate_csa"] = 8;
  j["compress_rate_hca"] = 32;
  j["num_hash_layers"] = 2;
  j["qk_rope_head_dim"] = 32;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 512}};
  j["sliding_window"] = 32;
  const ModelConfig c = ParseOrDie(j);
  EXPECT_EQ(c.csa_ratio, 8);
  EXPECT_EQ(c.hca_ratio, 32);
  EXPECT_EQ(c.layer_types, (std::vector<AttnType>{AttnType::kSliding, AttnType::kCsa,
                                                  AttnType::kHca, AttnType::kCsa, AttnType::kHca,
                                                  AttnType::kSliding}));
  EXPECT_EQ(c.mlp_types[1], MlpType::kHashMoe);
  EXPECT_EQ(c.mlp_types[2], MlpType::kMoe);
  EXPECT_EQ(c.rope_dims, 32);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.factor, 8);
  EXPECT_EQ(c.compress_rope.original_max_position, 512);
  EXPECT_DOUBLE_EQ(c.compress_rope.theta, 160000);  // compress_rope_theta, not rope_theta
  EXPECT_FALSE(c.main_rope.yarn);
}

TEST(ModelConfig, FlatRopeParametersAndTopLevelYarnKeys) {
  Json flat = TinyConfigJson();
  flat["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 16.0},
                             {"original_max_position_embeddings", 1024}, {"beta_fast", 16.0}};
  const ModelConfig a = ParseOrDie(flat);
  EXPECT_DOUBLE_EQ(a.compress_rope.factor, 16);
  EXPECT_DOUBLE_EQ(a.compress_rope.beta_fast, 16);
  EXPECT_DOUBLE_EQ(a.compress_rope.theta, 160000);
  EXPECT_DOUBLE_EQ(a.main_rope.theta, 10000);

  Json official = TinyConfigJson();
  official.erase("rope_parameters");
  official["rope_factor"] = 16;
  official["original_seq_len"] = 65536;
  official["beta_fast"] = 32;
  official["beta_slow"] = 1;
  const ModelConfig b = ParseOrDie(official);
  EXPECT_TRUE(b.compress_rope.yarn);
  EXPECT_DOUBLE_EQ(b.compress_rope.factor, 16);
  EXPECT_EQ(b.compress_rope.original_max_position, 65536);

  // Without a factor, YaRN derives it from the two context lengths.
  Json derived = TinyConfigJson();
  derived["rope_parameters"]["compress"].erase("factor");
  EXPECT_DOUBLE_EQ(ParseOrDie(derived).compress_rope.factor, 4096.0 / 64);
}

TEST(ModelConfig, CompressAttentionFactorIsAlwaysOne) {
  Json j = TinyConfigJson();
  j["rope_parameters"]["compress"]["attention_factor"] = 1.2773;
  const ModelConfig c = ParseOrDie(j);  // accepted with a warning; no mscale exists in RopeConfig
  EXPECT_TRUE(c.compress_rope.yarn);
}

TEST(ModelConfig, RatioAboveWindowIsAllowed) {
  Json j = TinyConfigJson();
  j["compress_rates"]["heavily_compressed_attention"] = 32;
  EXPECT_EQ(ParseOrDie(j).hca_ratio, 32);
}

struct BadCase {
  std::string name;
  std::function<void(Json&)> mutate;
  std::string expect;  // substring of the error
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class ModelConfigErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(ModelConfigErrors, NamesTheProblem) {
  Json j = TinyConfigJson();
  GetParam().mutate(j);
  auto c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok()) << GetParam().name;
  EXPECT_EQ(c.status().code(), GetParam().code) << c.status();
  EXPECT_NE(c.status().message().find(GetParam().expect), std::string::npos) << c.status();
}

INSTANTIATE_TEST_SUITE_P(
    All, ModelConfigErrors,
    ::testing::Values(
        BadCase{"layer_types_length", [](Json& j) { j["layer_types"].erase(0); }, "layer_types"},
        BadCase{"layer_type_name", [](Json& j) { j["layer_types"][2] = "dense"; }, "layer_types[2]"},
        BadCase{"heads_vs_groups", [](Json& j) { j["o_groups"] = 3; }, "o_groups"},
        BadCase{"mlp_types_length", [](Json& j) { j["mlp_layer_types"].push_back("moe"); },
                "mlp_layer_types"},
        BadCase{"mlp_type_name", [](Json& j) { j["mlp_layer_types"][0] = "dense"; },
                "mlp_layer_types[0]"},
        BadCase{"no_schedule", [](Json& j) { j.erase("layer_types"); }, "layer_types"},
        BadCase{"bad_ratio_value",
                [](Json& j) {
                  j.erase("layer_types");
                  j["compress_ratios"] = {0, 7, 16, 4, 16, 0};
                },
                "compress_ratios[1]"},
        BadCase{"short_ratios",
                [](Json& j) {
                  j.erase("layer_types");
                  j["compress_ratios"] = {0, 4};
                },
                "compress_ratios"},
        BadCase{"schedules_disagree", [](Json& j) { j["compress_ratios"] = {0, 4, 16, 16, 16, 0}; },
                "disagrees with compress_ratios"},
        BadCase{"odd_head_dim", [](Json& j) { j["head_dim"] = 63; }, "head_dim"},
        BadCase{"rope_dims_too_big",
                [](Json& j) {
                  j["qk_rope_head_dim"] = 128;
                  j.erase("partial_rotary_factor");
                },
                "qk_rope_head_dim"},
        BadCase{"rope_dims_disagree", [](Json& j) { j["qk_rope_head_dim"] = 32; },
                "qk_rope_head_dim"},
        BadCase{"nested_prf_disagrees",
                [](Json& j) { j["rope_parameters"]["compress"]["partial_rotary_factor"] = 0.5; },
                "rope_parameters.compress.partial_rotary_factor"},
        BadCase{"kv_heads", [](Json& j) { j["num_key_value_heads"] = 2; }, "num_key_value_heads",
                absl::StatusCode::kUnimplemented},
        BadCase{"vocab_zero", [](Json& j) { j["vocab_size"] = 0; }, "vocab_size"},
        BadCase{"vocab_string", [](Json& j) { j["vocab_size"] = "big"; }, "vocab_size"},
        BadCase{"vocab_fraction", [](Json& j) { j["vocab_size"] = 10.5; }, "vocab_size"},
        BadCase{"topk_experts", [](Json& j) { j["num_experts_per_tok"] = 9; }, "num_experts_per_tok"},
        BadCase{"scoring", [](Json& j) { j["scoring_func"] = "softmax"; }, "scoring_func",
                absl::StatusCode::kUnimplemented},
        BadCase{"eos", [](Json& j) { j["eos_token_id"] = 5000; }, "eos_token_id"},
        BadCase{"eos_list", [](Json& j) { j["eos_token_id"] = {1, -1}; }, "eos_token_id"},
        BadCase{"rope_type", [](Json& j) { j["rope_parameters"]["compress"]["rope_type"] = "llama3"; },
                "rope_type", absl::StatusCode::kUnimplemented},
        BadCase{"main_yarn",
                [](Json& j) {
                  j["rope_parameters"]["main"] = j["rope_parameters"]["compress"];
                },
                "rope_parameters.main", absl::StatusCode::kUnimplemented},
        BadCase{"yarn_no_factor",
                [](Json& j) {
                  j["rope_parameters"]["compress"].erase("factor");
                  j["rope_parameters"]["compress"].erase("original_max_position_embeddings");
                },
                "factor"},
        BadCase{"betas", [](Json& j) { j["rope_parameters"]["compress"]["beta_fast"] = 0.5; },
                "beta_fast"},
        BadCase{"eps", [](Json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps"},
        BadCase{"model_type", [](Json& j) { j["model_type"] = "llama"; }, "model_type"},
        BadCase{"architectures", [](Json& j) { j["architectures"] = {"LlamaForCausalLM"}; },
                "architectures"},
        BadCase{"rates_key", [](Json& j) { j["compress_rates"]["dense"] = 2; },
                "compress_rates.dense"},
        BadCase{"rate_zero", [](Json& j) { j["compress_rates"]["compressed_sparse_attention"] = 0; },
                "compress_rates.compressed_sparse_attention"},
        BadCase{"same_rates",
                [](Json& j) { j["compress_rates"]["heavily_compressed_attention"] = 4; },
                "rates must differ"},
        BadCase{"index_dim", [](Json& j) { j["index_head_dim"] = 8; }, "index_head_dim"},
        BadCase{"hc_mult", [](Json& j) { j["hc_mult"] = 0; }, "hc_mult"},
        BadCase{"window", [](Json& j) { j["sliding_window"] = -1; }, "sliding_window"},
        BadCase{"not_object", [](Json& j) { j = Json::array(); }, "JSON object"},
        BadCase{"bias", [](Json& j) { j["attention_bias"] = true; }, "attention_bias",
                absl::StatusCode::kUnimplemented},
        BadCase{"activation", [](Json& j) { j["hidden_act"] = "gelu"; }, "hidden_act",
                absl::StatusCode::kUnimplemented},
        BadCase{"huge_dim", [](Json& j) { j["hidden_size"] = int64_t{1} << 40; }, "hidden_size"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(ModelConfig, InvalidJsonAndMissingFile) {
  EXPECT_FALSE(ParseModelConfig("{").ok());
  auto missing = LoadModelConfig("/nonexistent/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dsv4
