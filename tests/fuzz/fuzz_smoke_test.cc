// A deterministic, bounded stand-in for the libFuzzer run, so CI exercises the fuzz target on
// every build: random byte flips, truncations and splices of valid headers never crash, and any
// accepted header keeps every tensor inside the file.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "dsv4/v1/dsv4.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace dsv4 {
namespace {

TEST(FuzzSmoke, SafetensorsHeaderMutations) {
  std::vector<std::vector<uint8_t>> seeds = {
      testing::SafetensorsBytes({testing::F32Tensor("a", {2, 2}, {1, 2, 3, 4}),
                                 testing::I64Tensor("b", {1}, {7})}),
      testing::SafetensorsBytes({}),
  };
  std::mt19937_64 rng(2024);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> in = seeds[iter % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !in.empty(); ++e) {
      switch (rng() % 4) {
        case 0: in[rng() % in.size()] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: in[rng() % in.size()] = static_cast<uint8_t>(rng()); break;
        case 2: in.resize(rng() % in.size()); break;
        case 3: in.insert(in.begin() + static_cast<long>(rng() % in.size()), static_cast<uint8_t>(rng()));
                break;
      }
    }
    // Keep the header length plausible half of the time so that the JSON parser sees input.
    if (iter % 2 == 0 && in.size() >= 8) {
      const uint64_t n = in.size() - 8 - (rng() % 16 < in.size() - 8 ? rng() % 16 : 0);
      for (int i = 0; i < 8; ++i) in[i] = static_cast<uint8_t>(n >> (8 * i));
    }
    LLVMFuzzerTestOneInput(in.data(), in.size());
    uint64_t start = 0;
    accepted += ParseSafetensorsHeader(in.data(), in.size(), &start).ok();
  }
  // Some mutations (e.g. flips in tensor data) keep a valid file: the parser is not rejecting all.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 20000);
}

}  // namespace
}  // namespace dsv4

namespace dsv4::fuzz {
int TokenizerOneInput(const uint8_t* data, size_t size);
int RequestOneInput(const uint8_t* data, size_t size);
}  // namespace dsv4::fuzz

namespace dsv4 {
namespace {

// Random edits of `seed`: flips, overwrites, cuts and insertions.
std::string Mutate(std::string in, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    if (in.empty()) {
      in.push_back(static_cast<char>(rng()));
      continue;
    }
    switch (rng() % 4) {
      case 0: in[rng() % in.size()] ^= static_cast<char>(1u << (rng() % 8)); break;
      case 1: in[rng() % in.size()] = static_cast<char>(rng()); break;
      case 2: in.resize(rng() % in.size()); break;
      case 3: in.insert(in.begin() + static_cast<long>(rng() % in.size()), static_cast<char>(rng())); break;
    }
  }
  return in;
}

// The tokenizer target's invariants (round trip, bounded = unbounded) over mutated texts, and
// FromJson over mutated tokenizer files.
TEST(FuzzSmoke, TokenizerMutations) {
  const std::vector<std::string> texts = {
      "\x01hello world", "\x01<think>reasoning</think>answer", "\x01 caf\xc3\xa9 \xe2\x82\xac 123",
      "\x01<\xef\xbd\x9cUser\xef\xbd\x9c>hi<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", "\x01\n\n\t  x"};
  std::mt19937_64 rng(77);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string in = Mutate(texts[iter % texts.size()], rng);
    in[0] = 1;  // the text mode
    fuzz::TokenizerOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  }
  const std::string small_json = std::string("\x00", 1) +
      R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"\u0120":3},"merges":["a b"]},)"
      R"("added_tokens":[{"id":4,"content":"<x>","special":true}],)"
      R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false},"decoder":{"type":"ByteLevel"}})";
  ASSERT_EQ(fuzz::TokenizerOneInput(reinterpret_cast<const uint8_t*>(small_json.data()),
                                    small_json.size()),
            0);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string in = Mutate(small_json, rng);
    in[0] = 0;  // the tokenizer.json mode
    fuzz::TokenizerOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  }
}

// The request target's invariants over mutated wire bytes of valid requests.
TEST(FuzzSmoke, RequestMutations) {
  std::vector<std::string> seeds;
  v1::GenerateRequest ids;
  for (int id : {5, 6, 7}) ids.mutable_token_ids()->add_ids(id);
  ids.set_max_tokens(8);
  ids.add_stop("x");
  ids.mutable_sampling()->set_temperature(0.7f);
  ids.mutable_sampling()->set_top_p(0.9f);
  seeds.push_back(ids.SerializeAsString());
  v1::GenerateRequest text;
  text.set_text("hello <think> there");
  text.set_min_tokens(2);
  text.set_logprobs(3);
  seeds.push_back(text.SerializeAsString());
  v1::GenerateRequest chat;
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("1+1=?");
  chat.mutable_chat()->set_thinking(true);
  chat.add_stop_token_ids(3);
  seeds.push_back(chat.SerializeAsString());
  std::mt19937_64 rng(91);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const std::string in = iter < 3 ? seeds[iter] : Mutate(seeds[iter % seeds.size()], rng);
    fuzz::RequestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
    v1::GenerateRequest parsed;
    accepted += parsed.ParseFromString(in);
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace dsv4

namespace dsv4::fuzz {
int DsmlParserOneInput(const uint8_t* data, size_t size);
int OpenAiRequestOneInput(const uint8_t* data, size_t size);
}  // namespace dsv4::fuzz

namespace dsv4 {
namespace {

std::vector<std::string> CorpusSeeds(const std::string& target) {
  std::vector<std::string> seeds;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::string(DSV4_TEST_DATA_DIR "/../fuzz/corpus/") + target)) {
    std::ifstream in(entry.path(), std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return seeds;
}

// The DSML parser target's invariants (split == whole == one code point per delta, no markup in
// visible text, complete calls are JSON objects) over its seed corpus and mutations of it.
TEST(FuzzSmoke, DsmlParserMutations) {
  const std::vector<std::string> seeds = CorpusSeeds("dsml_parser");
  ASSERT_GE(seeds.size(), 5u);
  std::mt19937_64 rng(53227);
  for (int iter = 0; iter < 4000; ++iter) {
    const size_t i = iter % seeds.size();
    const std::string in = iter < static_cast<int>(seeds.size()) ? seeds[i] : Mutate(seeds[i], rng);
    fuzz::DsmlParserOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  }
}

// The OpenAI request target's invariants (refusals name their field; accepted bodies have one
// prompt and pass or fail ValidateRequest cleanly) over its corpus and mutations of it.
TEST(FuzzSmoke, OpenAiRequestMutations) {
  const std::vector<std::string> seeds = CorpusSeeds("openai_request");
  ASSERT_GE(seeds.size(), 4u);
  std::mt19937_64 rng(40801);
  for (int iter = 0; iter < 6000; ++iter) {
    const size_t i = iter % seeds.size();
    const std::string in = iter < static_cast<int>(seeds.size()) ? seeds[i] : Mutate(seeds[i], rng);
    fuzz::OpenAiRequestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  }
}

}  // namespace
}  // namespace dsv4
