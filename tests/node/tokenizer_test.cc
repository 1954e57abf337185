#include "node/tokenizer/tokenizer.h"

#include <string>

#include "gtest/gtest.h"
#include "node/chat_format.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

class TokenizerGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::Load(testing::TestData("tok-tiny/tokenizer.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = tok->release();
    auto text = ReadFileToString(testing::TestData("tok-tiny/tokenizer_golden.json"), 1 << 24);
    ASSERT_TRUE(text.ok());
    golden_ = new Json(*ParseJson(*text, "golden"));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete golden_;
  }
  static Tokenizer* tok_;
  static Json* golden_;
};
Tokenizer* TokenizerGolden::tok_ = nullptr;
Json* TokenizerGolden::golden_ = nullptr;

TEST_F(TokenizerGolden, EveryCaseEncodesAndDecodesExactly) {
  int cases = 0;
  for (const Json& c : (*golden_)["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto expect = c["ids"].get<std::vector<int32_t>>();
    auto ids = tok_->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, expect) << "text: " << text;
    auto pieces = tok_->EncodePieces(text);
    ASSERT_TRUE(pieces.ok());
    EXPECT_EQ(*pieces, c["pieces"].get<std::vector<std::string>>()) << text;
    EXPECT_EQ(tok_->Decode(expect), c["decoded"].get<std::string>()) << text;
    EXPECT_EQ(tok_->Decode(expect, /*skip_special_tokens=*/true),
              c["decoded_skip_special"].get<std::string>())
        << text;
    // Streaming one token at a time concatenates to the full decode, never splitting a character.
    StreamDecoder stream(tok_, /*skip_special_tokens=*/false);
    std::string streamed;
    for (int32_t id : expect) {
      const std::string delta = stream.Push(id);
      EXPECT_TRUE(IsValidUtf8(delta)) << text;
      streamed += delta;
    }
    streamed += stream.Finish();
    EXPECT_EQ(streamed, c["decoded"].get<std::string>()) << text;
    ++cases;
  }
  EXPECT_EQ(cases, 28);
}

TEST_F(TokenizerGolden, EverySingleTokenDecode) {
  int n = 0;
  for (const auto& [id, text] : (*golden_)["single_token_decode"].items()) {
    EXPECT_EQ(tok_->Decode({std::stoi(id)}), text.get<std::string>()) << "id " << id;
    ++n;
  }
  EXPECT_EQ(n, 1024);
  EXPECT_EQ(tok_->vocab_size(), 1024);
}

TEST_F(TokenizerGolden, SpecialTokens) {
  for (const auto& [content, id] : (*golden_)["special_tokens"].items()) {
    EXPECT_EQ(tok_->TokenId(content), id.get<int32_t>()) << content;
    EXPECT_TRUE(tok_->IsSpecial(id.get<int32_t>()));
  }
  EXPECT_FALSE(tok_->IsSpecial(9));
}

TEST_F(TokenizerGolden, StreamingHoldsBackPartialCharacters) {
  auto ids = tok_->Encode("😀");  // three tokens, four bytes
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 3u);
  StreamDecoder stream(tok_);
  EXPECT_EQ(stream.Push((*ids)[0]), "");
  EXPECT_EQ(stream.Push((*ids)[1]), "");
  EXPECT_EQ(stream.Push((*ids)[2]), "😀");
  // An unfinished character is flushed as U+FFFD at the end, like a full decode.
  StreamDecoder cut(tok_);
  EXPECT_EQ(cut.Push((*ids)[0]), "");
  EXPECT_EQ(cut.Finish(), "\xEF\xBF\xBD");
}

TEST_F(TokenizerGolden, ChatFormat) {
  auto text = RenderChat({{"user", "hello"}, {"assistant", "<think>hmm</think>Hello!"}, {"user", "1+1=?"}},
                         /*thinking=*/true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>"
            "<｜User｜>1+1=?<｜Assistant｜><think>");
  auto ids = tok_->Encode(*text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 0);
  EXPECT_EQ(ids->back(), 5);
  auto off = RenderChat({{"system", "Be brief."}, {"user", "hi"}}, false);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, "<｜begin▁of▁sentence｜>Be brief.<｜User｜>hi<｜Assistant｜></think>");
  EXPECT_FALSE(RenderChat({}, true).ok());
  auto bad = RenderChat({{"user", "a"}, {"user", "b"}}, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("messages[1].role"), std::string::npos);
  EXPECT_FALSE(RenderChat({{"user", "a"}, {"assistant", "b"}}, true).ok());
  EXPECT_FALSE(RenderChat({{"user", "a"}, {"tool", "b"}}, true).ok());
}

TEST(Tokenizer, RejectsBadInput) {
  auto tok = Tokenizer::Load(testing::TestData("tok-tiny/tokenizer.json"));
  ASSERT_TRUE(tok.ok());
  EXPECT_FALSE((*tok)->Encode("\xff\xfe").ok());
  EXPECT_EQ(Utf8Lossy("a\xF0\x9F" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogates
  struct Case {
    std::string json, expect;
  };
  const std::vector<Case> cases = {
      {"[]", "not a JSON object"},
      {R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})", "non-BPE"},
      {R"({"model": {"type": "BPE", "vocab": {}}})", "vocab"},
      {R"({"model": {"type": "BPE", "vocab": {"a": -1}}})", "vocab"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}})", "merges[0]"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}})", "merges[0]"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "normalizer": {"type": "NFC"}})",
       "normalizer"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Split",
          "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})", "does not compile"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Whitespace"}})",
       "Whitespace"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": 1}]})",
       "added_tokens[0]"},
      // Fields of the wrong JSON type are errors naming the field, not exceptions (the tokenizer
      // fuzzer's crash of 2026-12-01: "type": [...] aborted the process).
      {R"({"model": {"type": ["a b"]}})", "model.type must be a string"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "ignore_merges": "yes"}})",
       "model.ignore_merges must be a boolean"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}},
          "added_tokens": [{"id": 1, "content": "<x>", "lstrip": 1}]})",
       "added_tokens[0].lstrip must be a boolean"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": 7}})",
       "pre_tokenizer.type must be a string"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "ByteLevel",
          "use_regex": "no"}})", "pre_tokenizer.use_regex must be a boolean"},
  };
  for (const auto& c : cases) {
    auto t = Tokenizer::FromJson(c.json);
    ASSERT_FALSE(t.ok()) << c.json;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status();
  }
}

}  // namespace
}  // namespace dsv4
