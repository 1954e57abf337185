// libFuzzer target for the tokenizer: the first byte picks the part under test.
//   even: the rest is a tokenizer.json for Tokenizer::FromJson (any text, never a crash; an
//         accepted file encodes and decodes a probe string);
//   odd:  the rest is text for the tok-tiny tokenizer: Encode never crashes, decoding what it
//         encoded gives the text back, and the bounded Encode agrees with the unbounded one.
//   ninja -C build-fuzz tokenizer_fuzzer && build-fuzz/tests/tokenizer_fuzzer tests/fuzz/corpus/tokenizer
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "common/json_util.h"
#include "node/tokenizer/tokenizer.h"

namespace dsv4::fuzz {

int TokenizerOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto tok = Tokenizer::FromJson(rest);
    if (tok.ok()) {
      auto ids = (*tok)->Encode("hello <think> world");
      if (ids.ok()) (*tok)->Decode(*ids);
    }
    return 0;
  }
  static const std::unique_ptr<Tokenizer> tiny = [] {
    auto t = Tokenizer::Load(DSV4_TEST_DATA_DIR "/tok-tiny/tokenizer.json");
    if (!t.ok()) std::abort();
    return std::move(*t);
  }();
  auto ids = tiny->Encode(rest);
  if (!ids.ok()) {
    if (IsValidUtf8(rest)) std::abort();  // only invalid UTF-8 is refused
    return 0;
  }
  for (int32_t id : *ids) {
    if (id < 0 || id >= tiny->vocab_size()) std::abort();
  }
  if (tiny->Decode(*ids) != rest) std::abort();
  const int64_t limit = static_cast<int64_t>(ids->size() / 2);
  auto bounded = tiny->Encode(rest, limit);
  if (bounded.ok() != (static_cast<int64_t>(ids->size()) <= limit)) std::abort();
  auto exact = tiny->Encode(rest, static_cast<int64_t>(ids->size()));
  if (!exact.ok() || *exact != *ids) std::abort();
  return 0;
}

}  // namespace dsv4::fuzz

#ifndef DSV4_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dsv4::fuzz::TokenizerOneInput(data, size);
}
#endif
