#include "worker/checkpoint/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

using testing::F32Tensor;
using testing::SafetensorsBytes;
using testing::TempDir;
using testing::WriteFile;

// A raw safetensors image with the given header text and `data_bytes` zero data bytes.
std::vector<uint8_t> Raw(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

absl::Status Parse(const std::vector<uint8_t>& bytes) {
  uint64_t start = 0;
  return ParseSafetensorsHeader(bytes.data(), bytes.size(), &start).status();
}

TEST(Safetensors, RoundTrip) {
  const auto bytes = SafetensorsBytes({F32Tensor("a", {2, 3}, {1, 2, 3, 4, 5, 6}),
                                       F32Tensor("b", {1}, {7})});
  uint64_t start = 0;
  auto t = ParseSafetensorsHeader(bytes.data(), bytes.size(), &start);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  const TensorInfo& a = (*t)[0].name == "a" ? (*t)[0] : (*t)[1];
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.nbytes, 24u);
  float v;
  std::memcpy(&v, bytes.data() + start + a.begin + 4 * 5, 4);
  EXPECT_EQ(v, 6.0f);
}

struct Corruption {
  std::string name;
  std::string header;
  size_t data_bytes;
  std::string expect;
};

void PrintTo(const Corruption& c, std::ostream* os) { *os << c.name; }

class SafetensorsCorrupt : public ::testing::TestWithParam<Corruption> {};

TEST_P(SafetensorsCorrupt, GivesAClearError) {
  const auto s = Parse(Raw(GetParam().header, GetParam().data_bytes));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(GetParam().expect), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(
    All, SafetensorsCorrupt,
    ::testing::Values(
        Corruption{"not_json", "{\"a\": ", 0, "not valid JSON"},
        Corruption{"not_object", "[1, 2]", 0, "not a JSON object"},
        Corruption{"bad_dtype", R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1,
                   "unsupported dtype"},
        Corruption{"no_dtype", R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4, "missing dtype"},
        Corruption{"negative_dim", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
                   "non-negative"},
        Corruption{"size_mismatch", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4,
                   "needs 8 bytes"},
        Corruption{"past_end", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4,
                   "truncated"},
        Corruption{"reversed", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8,
                   "begin > end"},
        Corruption{"overlap",
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                       "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   12, "overlap"},
        Corruption{"extra_field",
                   R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4,
                   "unexpected field"},
        Corruption{"duplicate",
                   R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                       "a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   8, "duplicate key"},
        Corruption{"huge_shape",
                   R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                   4, "too large"},
        Corruption{"bad_metadata", R"({"__metadata__":{"k":1}})", 0, "__metadata__"},
        Corruption{"offsets_shape", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4,
                   "data_offsets"}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return info.param.name; });

TEST(Safetensors, TruncatedFiles) {
  const auto good = SafetensorsBytes({F32Tensor("a", {4}, {1, 2, 3, 4})});
  // Every proper prefix is rejected (never a crash).
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + n);
    EXPECT_FALSE(Parse(cut).ok()) << "prefix of " << n << " bytes";
  }
  std::vector<uint8_t> huge_len(16, 0xff);
  EXPECT_FALSE(Parse(huge_len).ok());
}

TEST(Checkpoint, SingleFileAndDirectory) {
  const std::string dir = TempDir("single");
  WriteFile(dir + "/model.safetensors", SafetensorsBytes({F32Tensor("w", {2}, {1, 2})}));
  for (const std::string& path : {dir, dir + "/model.safetensors"}) {
    auto ckpt = Checkpoint::Open(path);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ASSERT_NE((*ckpt)->Find("w"), nullptr);
    EXPECT_EQ((*ckpt)->Find("v"), nullptr);
  }
  auto missing = Checkpoint::Open(dir + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  const std::string empty = TempDir("empty");
  auto none = Checkpoint::Open(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("model.safetensors"), std::string::npos);
}

TEST(Checkpoint, Sharded) {
  const std::string dir = TempDir("sharded");
  WriteFile(dir + "/s1.safetensors", SafetensorsBytes({F32Tensor("a", {1}, {1})}));
  WriteFile(dir + "/s2.safetensors", SafetensorsBytes({F32Tensor("b", {1}, {2})}));
  WriteFile(dir + "/model.safetensors.index.json",
            std::string(R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})"));
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_NE((*ckpt)->Find("a"), nullptr);
  EXPECT_NE((*ckpt)->Find("b"), nullptr);
  float v;
  std::memcpy(&v, (*ckpt)->Bytes(*(*ckpt)->Find("b")).data, 4);
  EXPECT_EQ(v, 2.0f);
}

TEST(Checkpoint, ShardedErrors) {
  struct Case {
    std::string index;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"weight_map":{"a":"../s1.safetensors"}})", "must be a file name"},
      {R"({"weight_map":{"a":"missing.safetensors"}})", "missing.safetensors"},
      {R"({"weight_map":{"a":"s2.safetensors","b":"s1.safetensors"}})", "found in"},
      {R"({"weight_map":{"zz":"s1.safetensors"}})", "does not hold it"},
      {R"({"weight_map":{}})", "empty"},
      {R"({"nothing":1})", "weight_map"},
      {R"({"weight_map":{"a":1}})", "must be a file name"},
  };
  for (const auto& c : cases) {
    const std::string dir = TempDir("shard_err");
    WriteFile(dir + "/s1.safetensors", SafetensorsBytes({F32Tensor("a", {1}, {1})}));
    WriteFile(dir + "/s2.safetensors", SafetensorsBytes({F32Tensor("b", {1}, {2})}));
    WriteFile(dir + "/model.safetensors.index.json", c.index);
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_FALSE(ckpt.ok()) << c.index;
    EXPECT_NE(ckpt.status().message().find(c.expect), std::string::npos)
        << c.index << " -> " << ckpt.status();
  }
  // The same tensor in two shards.
  const std::string dir = TempDir("shard_dup");
  WriteFile(dir + "/s1.safetensors", SafetensorsBytes({F32Tensor("a", {1}, {1})}));
  WriteFile(dir + "/s2.safetensors", SafetensorsBytes({F32Tensor("a", {1}, {2})}));
  WriteFile(dir + "/model.safetensors.index.json",
            std::string(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})"));
  auto dup = Checkpoint::Open(dir);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("also appears"), std::string::npos) << dup.status();
}

}  // namespace
}  // namespace dsv4
