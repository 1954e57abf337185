// libFuzzer target for the public API's request path: bytes off the wire parsed as a
// dsv4.v1.GenerateRequest (as the service does) and validated against the tok-tiny tokenizer and
// small node limits. Invariants of an accepted request: a non-empty prompt of in-vocabulary ids
// that leaves room in the model length and the KV pool, sane sampling, bounded stops; every error
// names a field and is short.
//   ninja -C build-fuzz request_fuzzer && build-fuzz/tests/request_fuzzer tests/fuzz/corpus/request
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "dsv4/v1/dsv4.pb.h"
#include "node/request_validation.h"
#include "node/tokenizer/tokenizer.h"

namespace dsv4::fuzz {

int RequestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> tiny = [] {
    auto t = Tokenizer::Load(DSV4_TEST_DATA_DIR "/tok-tiny/tokenizer.json");
    if (!t.ok()) std::abort();
    return std::move(*t);
  }();
  v1::GenerateRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  NodeLimits limits;
  limits.vocab_size = 1024;
  limits.max_model_len = 256;
  limits.kv_capacity_tokens = 200;
  limits.default_max_tokens = 64;
  limits.eos_token_ids = {1};
  limits.max_input_bytes = 1 << 16;
  auto v = ValidateRequest(req, *tiny, limits, 7);
  if (!v.ok()) {
    const std::string_view msg(v.status().message().data(), v.status().message().size());
    if (msg.empty() || msg.size() > 1024) std::abort();
    return 0;
  }
  const int64_t prompt = static_cast<int64_t>(v->prompt.size());
  if (prompt == 0 || prompt >= limits.max_model_len) std::abort();
  for (int32_t id : v->prompt) {
    if (id < 0 || id >= limits.vocab_size) std::abort();
  }
  const int64_t max_tokens = v->output.max_tokens;
  if (max_tokens < 1 || prompt + max_tokens > limits.max_model_len ||
      prompt + max_tokens > limits.kv_capacity_tokens) {
    std::abort();
  }
  const SamplingSpec& s = *v->sampling;
  if (!(s.temperature >= 0 && s.temperature <= 100) || !(s.top_p > 0 && s.top_p <= 1) ||
      !(s.min_p >= 0 && s.min_p <= 1) || s.top_k < 0 || s.logprobs < 0 ||
      s.logprobs > limits.max_logprobs || !std::isfinite(s.repetition_penalty) ||
      s.min_tokens < 0 || s.min_tokens > max_tokens) {
    std::abort();
  }
  if (static_cast<int32_t>(v->output.stop_strings.size()) > limits.max_stop_strings) std::abort();
  return 0;
}

}  // namespace dsv4::fuzz

#ifndef DSV4_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dsv4::fuzz::RequestOneInput(data, size);
}
#endif
