// Prefix caching at the model level: a sequence that starts from a snapshot of another's state at
// a block boundary (its blocks shared, its ring and compressor state restored) gives the logits a
// cold prefill of the same prompt gives, bit for bit on the CPU, whether the snapshot was taken
// inside a chunk (RingSnapshot / CompressSnapshot) or at a chunk's end (a row copy), for every
// boundary, and on configs with the window shorter and longer than a block. The same runs on the
// GPU (skipped without one): bit for bit in batch-invariant mode; in the default fp32 mode a hit's
// suffix is a prefill of another chunking, which cuBLASLt computes with kernels picked by the row
// count, so there the logits are compared within fp32 tolerance and the test prints how many hits
// were bit-exact.
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/backend_pair.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/test_backends.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/dsv4_model.h"
#include "worker/worker_factory.h"

namespace dsv4 {
namespace {

using Logits = SequenceStep::Logits;

struct Variant {
  std::string name;
  int32_t block_size;
  std::function<void(Json&)> edit;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

using testing::TestBackend;

std::vector<Variant> Variants() {
  return {
      // Ratios 4 and 128, window 128: one HCA entry per block, the window = a block.
      {"tiny", 128, [](Json&) {}},
      // Window 8 < block 16; ratios 2 and 8 (CSA overlap state at every boundary).
      {"csa_window8_block16", 16,
       [](Json& j) {
         j["sliding_window"] = 8;
         j["compress_rates"] = {{"compressed_sparse_attention", 2},
                                {"heavily_compressed_attention", 8}};
         j["index_topk"] = 3;
       }},
      // Window 40 > block 16 (the ring spans blocks); HCA ratio 16.
      {"window40_block16", 16,
       [](Json& j) {
         j["sliding_window"] = 40;
         j["compress_rates"] = {{"compressed_sparse_attention", 4},
                                {"heavily_compressed_attention", 16}};
       }},
  };
}

class StateSnapshot : public ::testing::TestWithParam<std::tuple<Variant, TestBackend>> {
 protected:
  static constexpr int kLen = 300;
  static constexpr int32_t kSlots = 3;

  void SetUp() override {
    const Variant& v = std::get<0>(GetParam());
    const TestBackend on = std::get<1>(GetParam());
    gpu_ = testing::IsCuda(on);
    exact_only_ = testing::IsBatchInvariant(on);
    if (gpu_) DSV4_REQUIRE_GPU();
    Json j = testing::TinyConfigJson();
    v.edit(j);
    auto config = ParseModelConfig(j.dump());
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    const std::string dir = testing::WriteSyntheticModel("model", j, /*seed=*/5);
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    bs_ = v.block_size;
    CacheConfig cache;
    cache.block_size = bs_;
    cache.num_slots = kSlots;
    cache.num_state_snapshots = kLen / bs_ + 1;
    cache.num_blocks = 3 * (kLen / bs_ + 2);
    auto backend = testing::MakeTestBackend(on);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto model = Dsv4Model::Load(config_, **ckpt, std::move(*backend), cache);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    std::mt19937 rng(3);
    prompt_.resize(kLen);
    for (auto& t : prompt_) t = static_cast<int32_t>(rng() % config_.vocab_size);
  }

  // Runs tokens [from, prompt.size()) of `prompt` in `slot` with `blocks` in chunks; logits of
  // every position from `from`. Snapshots of every block boundary reached go to row
  // kSlots + boundary / bs - 1 when `snapshot`.
  std::vector<float> Run(const std::vector<int32_t>& prompt, int32_t from, int32_t slot,
                         const std::vector<int32_t>& blocks, int32_t restore_from,
                         std::vector<int> chunks, bool snapshot) {
    std::vector<float> all;
    int32_t pos = from;
    bool first = true;
    while (pos < static_cast<int32_t>(prompt.size())) {
      int32_t n = static_cast<int32_t>(prompt.size()) - pos;
      if (!chunks.empty()) {
        n = std::min(n, chunks.front());
        chunks.erase(chunks.begin());
      }
      std::vector<StateSnapshotAt> snaps;
      for (int32_t b = (pos / bs_ + 1) * bs_; snapshot && b <= pos + n; b += bs_) {
        snaps.push_back({b, kSlots + b / bs_ - 1});
      }
      SequenceStep s;
      s.tokens = std::span(prompt).subspan(pos, n);
      s.start_pos = pos;
      s.state_slot = slot;
      s.block_table = blocks;
      s.logits = Logits::kAll;
      s.restore_from = first ? restore_from : -1;
      s.snapshots = snaps;
      StepLogits out;
      const absl::Status st = model_->Step({&s, 1}, StepOptions{}, &out);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) return {};
      all.insert(all.end(), out.values.begin(), out.values.end());
      pos += n;
      first = false;
    }
    return all;
  }

  std::vector<int32_t> Blocks(int32_t first) const {
    std::vector<int32_t> b;
    for (int32_t i = 0; i < kLen / bs_ + 1; ++i) b.push_back(first + i);
    return b;
  }

  // Bit for bit on the CPU and in batch-invariant mode; else within fp32 tolerance (counted in
  // `exact_`).
  void ExpectSame(const std::vector<float>& hit, const float* cold, const std::string& what) {
    const bool exact = std::memcmp(hit.data(), cold, sizeof(float) * hit.size()) == 0;
    ++tried_;
    exact_ += exact ? 1 : 0;
    if (exact_only_) {
      EXPECT_TRUE(exact) << what;
      return;
    }
    EXPECT_TRUE(testing::Close(hit, std::vector<float>(cold, cold + hit.size()), 1e-4, 1e-4)) << what;
  }
  void TearDown() override {
    if (gpu_ && tried_ > 0) std::printf("    bit-exact hits on the GPU: %d of %d\n", exact_, tried_);
  }

  bool gpu_ = false;
  bool exact_only_ = true;
  int tried_ = 0, exact_ = 0;
  ModelConfig config_;
  std::unique_ptr<Dsv4Model> model_;
  int32_t bs_ = 0;
  std::vector<int32_t> prompt_;
};

TEST_P(StateSnapshot, HitsAtEveryBoundaryEqualAColdPrefill) {
  const int32_t nb = kLen / bs_ + 2;
  // The cached sequence: chunks that put some boundaries inside a chunk and one at a chunk's end.
  const std::vector<int32_t> cached_blocks = Blocks(0);
  Run(prompt_, 0, 0, cached_blocks, -1, {37, bs_ - 37 % bs_ + bs_, 100}, /*snapshot=*/true);
  const int vocab = static_cast<int>(config_.vocab_size);
  for (int32_t b = bs_; b < kLen; b += bs_) {
    // Another prompt sharing the first b tokens, then its own.
    std::vector<int32_t> other = prompt_;
    std::mt19937 rng(b);
    for (int32_t i = b; i < kLen; ++i) other[i] = static_cast<int32_t>(rng() % vocab);
    for (const std::vector<int32_t>* p : {&prompt_, &other}) {
      const std::vector<float> cold = Run(*p, 0, 1, Blocks(nb), -1, {}, false);
      // The hit: the cached blocks before b, fresh ones after.
      std::vector<int32_t> blocks = Blocks(2 * nb);
      std::copy(cached_blocks.begin(), cached_blocks.begin() + b / bs_, blocks.begin());
      const std::vector<float> hit = Run(*p, b, 2, blocks, kSlots + b / bs_ - 1, {19}, false);
      ASSERT_EQ(hit.size(), cold.size() - static_cast<size_t>(b) * vocab);
      ExpectSame(hit, cold.data() + static_cast<size_t>(b) * vocab,
                 absl::StrCat("hit at ", b, p == &other ? " (diverging prompt)" : " (same prompt)"));
    }
  }
}

TEST_P(StateSnapshot, WithoutTheRestoreTheStaleSlotGivesOtherLogits) {
  // The test can fail: skipping the restore (the slot holds another sequence's state) changes
  // the logits, so equality above is the restore's doing.
  const std::vector<int32_t> cached_blocks = Blocks(0);
  Run(prompt_, 0, 0, cached_blocks, -1, {}, /*snapshot=*/true);
  const int32_t nb = kLen / bs_ + 2, b = bs_;
  const std::vector<float> cold = Run(prompt_, 0, 1, Blocks(nb), -1, {}, false);
  std::vector<int32_t> blocks = Blocks(2 * nb);
  std::copy(cached_blocks.begin(), cached_blocks.begin() + 1, blocks.begin());
  Run(std::vector<int32_t>(prompt_.rbegin(), prompt_.rend()), 0, 2, Blocks(2 * nb), -1, {}, false);
  const std::vector<float> stale = Run(prompt_, b, 2, blocks, -1, {}, false);
  const size_t off = static_cast<size_t>(b) * config_.vocab_size;
  EXPECT_NE(std::memcmp(stale.data(), cold.data() + off, sizeof(float) * stale.size()), 0);
}

TEST_P(StateSnapshot, RejectsBadSnapshotsWithoutSideEffects) {
  const std::vector<int32_t> blocks = Blocks(0);
  auto step = [&](int32_t start, int32_t restore, std::vector<StateSnapshotAt> snaps) {
    SequenceStep s;
    s.tokens = std::span(prompt_).subspan(0, 10);
    s.start_pos = start;
    s.state_slot = 0;
    s.block_table = blocks;
    s.restore_from = restore;
    s.snapshots = snaps;
    StepLogits out;
    return model_->Step({&s, 1}, StepOptions{}, &out);
  };
  const int32_t row = kSlots;
  for (auto [status, what] : {
           std::pair{step(0, row, {}), "restore at 0"},
           std::pair{step(bs_, 1, {}), "restore from a slot"},
           std::pair{step(bs_ + 1, row, {}), "restore off a boundary"},
           std::pair{step(bs_, kSlots + kLen, {}), "restore past the rows"},
           std::pair{step(0, -1, {{bs_, row}}), "snapshot past the chunk"},
           std::pair{step(bs_ - 5, -1, {{bs_, 0}}), "snapshot into a slot"},
           std::pair{step(bs_, row, {{2 * bs_, row}}), "snapshot onto the restore row"},
       }) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, StateSnapshot,
                         ::testing::Combine(::testing::ValuesIn(Variants()),
                                            ::testing::Values(TestBackend::kCpu,
                                                              TestBackend::kCudaFp32,
                                                              TestBackend::kCudaFp32Invariant)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  testing::TestBackendName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace dsv4
