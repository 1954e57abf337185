// A deterministic, bounded stand-in for the libFuzzer run, so CI exercises the fuzz target on
// every build: random byte flips, truncations and splices of valid headers never crash, and any
// accepted header keeps every tensor inside the file.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/model/safetensors.h"

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
