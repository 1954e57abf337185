// libFuzzer target for the OpenAI API's request bodies (node/openai/request.h): bytes as a POST
// body (the first byte picks chat or completions), parsed and, when accepted, validated like a
// gRPC request against the tok-tiny tokenizer. Invariants: every refusal is a 400-class error
// whose message starts with the field it names; an accepted body has exactly one prompt (rendered
// chat text ending in the assistant's turn, text, or ids) and the parser's options agree with the
// request's tools.
//   ninja -C build-fuzz openai_request_fuzzer && build-fuzz/tests/openai_request_fuzzer \
//     tests/fuzz/corpus/openai_request
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "node/openai/api_error.h"
#include "node/openai/request.h"
#include "node/request_validation.h"
#include "node/tokenizer/tokenizer.h"

namespace dsv4::fuzz {

int OpenAiRequestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> tiny = [] {
    auto t = Tokenizer::Load(DSV4_TEST_DATA_DIR "/tok-tiny/tokenizer.json");
    if (!t.ok()) std::abort();
    return std::move(*t);
  }();
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) == 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  openai::ParseLimits limits;
  auto r = chat ? openai::ParseChatRequest(body, limits) : openai::ParseCompletionRequest(body, limits);
  if (!r.ok()) {
    const openai::ApiError e = openai::FromStatus(r.status());
    if (e.status != 400 || e.param.empty() || e.message.rfind(e.param + ":", 0) != 0) std::abort();
    if (e.message.size() > 4096) std::abort();
    return 0;
  }
  const v1::GenerateRequest& g = r->generate;
  if (chat) {
    if (g.input_case() != v1::GenerateRequest::kText) std::abort();
    const std::string& t = g.text();
    if (t.find("<｜Assistant｜>") == std::string::npos) std::abort();
    if (r->parser.tools && r->parser.tool_names.empty()) std::abort();
  } else if (g.input_case() != v1::GenerateRequest::kText &&
             g.input_case() != v1::GenerateRequest::kTokenIds) {
    std::abort();
  }
  NodeLimits nl;
  nl.vocab_size = 1024;
  nl.max_model_len = 4096;
  nl.kv_capacity_tokens = 4096;
  nl.eos_token_ids = {1};
  auto v = ValidateRequest(g, *tiny, nl, 7);
  if (!v.ok()) {
    const openai::ApiError e = openai::FromStatus(
        v.status(), chat ? &openai::ChatFieldName : &openai::CompletionFieldName);
    if (e.status != 400 && e.status != 500) std::abort();
    return 0;
  }
  if (v->prompt.empty()) std::abort();
  return 0;
}

}  // namespace dsv4::fuzz

#ifndef DSV4_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dsv4::fuzz::OpenAiRequestOneInput(data, size);
}
#endif
