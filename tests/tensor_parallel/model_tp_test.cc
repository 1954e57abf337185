// Tensor + expert parallelism of the model (common/tensor_parallel.h): ranks as threads of this
// process, each with its own CpuBackend over a Gloo group, against the same model on one rank.
// The partial sums change the order of additions, so logits agree within rounding; the
// all-reduce hands every rank the same bits, so the ranks agree exactly.
#include <algorithm>

#include "tests/tensor_parallel/tp_harness.h"

namespace dsv4 {
namespace {

using testing::Source;
using testing::RunRank;

class ModelTensorParallel : public ::testing::TestWithParam<int> {
 protected:
  // TP n against TP1: within `tol` everywhere, identical on every rank, same argmax per row.
  void ExpectMatchesOneRank(const Source& src, int n, double tol) {
    auto one = RunRank(src, {0, 1}, nullptr);
    ASSERT_TRUE(one.ok()) << one.status();
    auto ranks = group_.RunGroup(src, n);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(n));
    ASSERT_EQ(ranks[0].size(), one->size());
    double max_abs = 0;
    for (size_t i = 0; i < one->size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(double(ranks[0][i]) - (*one)[i]));
    }
    EXPECT_LT(max_abs, tol) << "TP" << n << " vs TP1";
    EXPECT_GT(max_abs, 0.0) << "TP" << n << " should add in another order than TP1";
    for (int r = 1; r < n; ++r) EXPECT_EQ(ranks[r], ranks[0]) << "rank " << r << " differs";
    ASSERT_TRUE(ConfigVocab(src).ok());
    const int64_t V = *ConfigVocab(src);
    for (size_t row = 0; row * V < one->size(); ++row) {
      auto a = one->begin() + row * V, b = ranks[0].begin() + row * V;
      EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << "row " << row;
    }
  }

  static absl::StatusOr<int64_t> ConfigVocab(const Source& src) {
    ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(src.dir + "/config.json"));
    return c.vocab_size;
  }

  testing::TpGroup group_;
};

TEST_P(ModelTensorParallel, FixtureMatchesOneRank) {
  ExpectMatchesOneRank({testing::TestData("dsv4-tiny")}, GetParam(), 1e-4);
}

// The released layout: FP8 projections (their 128x128 blocks are larger than a rank's slice here,
// so the slices come back dequantised) and MXFP4 experts (whole experts per rank).
TEST_P(ModelTensorParallel, QuantisedFixtureMatchesOneRank) {
  ExpectMatchesOneRank({testing::TestData("dsv4-tiny-fp8")}, GetParam(), 1e-4);
}

// Synthetic weights: a rank's slices are cut from the tensors one rank makes.
TEST_P(ModelTensorParallel, SyntheticWeightsMatchOneRank) {
  ExpectMatchesOneRank({testing::TestData("dsv4-tiny"), true, false}, GetParam(), 1e-4);
  ExpectMatchesOneRank({testing::TestData("dsv4-tiny"), true, true}, GetParam(), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ModelTensorParallel, ::testing::Values(2, 4),
                         [](const auto& info) { return absl::StrCat("TP", info.param); });

// A rank reads its own slices only: at TP2 each rank reads the whole checkpoint less the other
// rank's experts and its halves of the split projections.
TEST(ModelTensorParallelReads, RanksReadTheirExpertsOnly) {
  auto config = LoadModelConfig(testing::TestData("dsv4-tiny") + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::Open(testing::TestData("dsv4-tiny"));
  ASSERT_TRUE(ckpt.ok());
  CacheConfig cache;
  cache.num_blocks = 4;
  cache.num_slots = 1;
  uint64_t whole = 0;
  LoadOptions one;
  one.bytes_read = &whole;
  ASSERT_TRUE(Dsv4Model::Load(*config, **ckpt, std::make_unique<CpuBackend>(), cache, one).ok());
  // Loading needs no collective: a size-2 layout with a stand-in communicator of the right shape.
  class Shape2 final : public Communicator {
   public:
    explicit Shape2(int r) : r_(r) {}
    int rank() const override { return r_; }
    int world_size() const override { return 2; }
    MemorySpace memory_space() const override { return MemorySpace::kHost; }
    std::string backend_name() const override { return "none"; }
    absl::Status AllReduceSum(const void*, void*, size_t, DType, void*) override { return absl::UnimplementedError(""); }
    absl::Status AllGather(const void*, void*, size_t, DType, void*) override { return absl::UnimplementedError(""); }
    absl::Status Broadcast(void*, size_t, DType, int, void*) override { return absl::UnimplementedError(""); }
    absl::Status Barrier() override { return absl::UnimplementedError(""); }
    absl::Status health() const override { return absl::OkStatus(); }
    void Abort(const absl::Status&) override {}
   private:
    int r_;
  };
  uint64_t rank_bytes[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    Shape2 comm(r);
    LoadOptions o;
    o.parallel = {r, 2};
    o.bytes_read = &rank_bytes[r];
    auto m = Dsv4Model::Load(*config, **ckpt, std::make_unique<CpuBackend>(&comm), cache, o);
    ASSERT_TRUE(m.ok()) << m.status();
  }
  std::printf("checkpoint bytes read: one rank %llu, TP2 ranks %llu + %llu\n",
              static_cast<unsigned long long>(whole), static_cast<unsigned long long>(rank_bytes[0]),
              static_cast<unsigned long long>(rank_bytes[1]));
  // The fixture stores fp32 per-expert w1, w2, w3 of [I, D] and the split projections (q_b, o_a,
  // o_b, sinks, the shared expert's three): each rank reads its half of both and all the rest.
  const ModelConfig& c = *config;
  const uint64_t L = static_cast<uint64_t>(c.num_layers);
  const uint64_t experts = L * c.n_routed_experts * 3 * c.moe_intermediate_size * c.hidden_size * 4;
  const uint64_t split =
      L * 4 *
      static_cast<uint64_t>(c.num_heads * c.head_dim * c.q_lora_rank +
                            c.o_groups * c.o_lora_rank * (c.num_heads / c.o_groups) * c.head_dim +
                            c.hidden_size * c.o_groups * c.o_lora_rank + c.num_heads +
                            3 * c.moe_intermediate_size * c.hidden_size);
  EXPECT_EQ(rank_bytes[0], whole - experts / 2 - split / 2);
  EXPECT_EQ(rank_bytes[1], whole - experts / 2 - split / 2);
}

TEST(ModelTensorParallelRefusals, SizesThatDoNotSplitAreRefusedAtLoad) {
  auto config = LoadModelConfig(testing::TestData("dsv4-tiny") + "/config.json");
  ASSERT_TRUE(config.ok());
  CacheConfig cache;
  cache.num_blocks = 4;
  cache.num_slots = 1;
  LoadOptions options;
  options.parallel = {0, 3};
  auto m = Dsv4Model::LoadSynthetic(*config, 1, std::make_unique<CpuBackend>(), cache, options);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("num_attention_heads (4)"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("this model takes 1, 2, 4"), std::string::npos) << m.status();
  // A size that splits, but no communicator.
  options.parallel = {0, 2};
  m = Dsv4Model::LoadSynthetic(*config, 1, std::make_unique<CpuBackend>(), cache, options);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("without a communicator"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace dsv4
