// Tokenizer: a Hugging Face `tokenizer.json` byte-level BPE, as DeepSeek ships it.
//
// Supported (anything else in the file is an Unimplemented error at load, never a silent
// difference): no normalizer (or an empty Sequence); pre-tokenizers Sequence / Split (regex or
// string; Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous; invert) / ByteLevel
// (add_prefix_space, use_regex); model BPE (merges as "a b" strings or pairs, unk_token,
// ignore_merges); decoder ByteLevel; added tokens with special / lstrip / rstrip / single_word.
// Regexes run through PCRE2 in UTF + UCP mode (Unicode property classes and look-ahead).
//
// Immutable after Load(); all methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4 {

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text);
  ~Tokenizer();

  // Encodes `text` without adding special tokens; spellings of added tokens in the text become
  // those tokens. InvalidArgument for text that is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;
  // The same, but stops as soon as the text is known to need more than `max_tokens` tokens
  // (OutOfRange "more than N tokens"), so that an over-long input costs little more than an
  // allowed one.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, int64_t max_tokens) const;
  // The most bytes of text one token can stand for, or 0 when that is unbounded (an added token
  // that strips surrounding whitespace, a pre-tokenizer that removes text). A text of B bytes
  // needs at least B / max_bytes_per_token() tokens, which bounds inputs before tokenizing.
  int64_t max_bytes_per_token() const { return max_bytes_per_token_; }
  // The pre-tokenized pieces of `text` as BPE tokens' strings (HF `tokens`), for tests.
  absl::StatusOr<std::vector<std::string>> EncodePieces(std::string_view text) const;

  // Decodes to text; invalid UTF-8 (e.g. a partial character) becomes U+FFFD as in HF.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // The raw bytes a token stands for (special tokens: their text). Empty for unknown ids.
  std::string TokenBytes(int32_t id) const;
  // The token's string in the vocabulary (byte-level characters), "" if unknown.
  std::string TokenString(int32_t id) const;

  bool IsSpecial(int32_t id) const;
  // Id of an added/special token by its content, or of a vocabulary entry.
  std::optional<int32_t> TokenId(std::string_view token) const;
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }

  struct Impl;

 private:
  Tokenizer();
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> id_to_token_;  // byte-level strings (added tokens: their content)
  int64_t max_bytes_per_token_ = 0;
};

// Replaces invalid UTF-8 with U+FFFD using Rust's String::from_utf8_lossy rules (one replacement
// per maximal invalid subpart), which is what HF tokenizers' decoding produces.
std::string Utf8Lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that ends on a character boundary, treating a trailing
// incomplete-but-valid-so-far sequence as not yet complete. Invalid bytes count as complete
// (they will decode to U+FFFD either way).
size_t CompleteUtf8Prefix(std::string_view bytes);

// True when `s` is valid UTF-8.
bool IsValidUtf8(std::string_view s);

// Incremental detokenizer: feeds token ids, returns text deltas that never split a UTF-8
// character. Concatenated deltas (plus Finish()) equal Tokenizer::Decode of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tok, bool skip_special_tokens = true)
      : tok_(tok), skip_special_(skip_special_tokens) {}
  std::string Push(int32_t id);
  // Flushes held-back bytes (an unfinished character becomes U+FFFD).
  std::string Finish();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsv4
