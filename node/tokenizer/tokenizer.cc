#include "node/tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/echo.h"
#include "common/json_util.h"
#include "common/status.h"

namespace dsv4 {
namespace {

// ---- UTF-8 helpers ----

// Width of a valid sequence starting at `b[0]` given the bytes available, or:
//   0 = invalid at b[0] (replace 1 byte), -k = incomplete but valid so far (k bytes),
//   +k with k > width-not-met handled by `bad` = invalid after k valid bytes.
struct Utf8Step {
  int consumed;    // bytes forming a valid char, or the invalid/incomplete subpart
  bool valid;      // a complete valid character
  bool incomplete; // ran out of input inside a valid-so-far sequence
};

Utf8Step DecodeStep(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {1, true, false};
  int width;
  unsigned char lo = 0x80, hi = 0xbf;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    width = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    width = 3;
    if (b0 == 0xe0) lo = 0xa0;
    if (b0 == 0xed) hi = 0x9f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    width = 4;
    if (b0 == 0xf0) lo = 0x90;
    if (b0 == 0xf4) hi = 0x8f;
  } else {
    return {1, false, false};
  }
  for (int i = 1; i < width; ++i) {
    if (static_cast<size_t>(i) >= n) return {i, false, true};
    const unsigned char b = p[i];
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xbf;
    if (b < l || b > h) return {i, false, false};
  }
  return {width, true, false};
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// GPT-2 byte <-> unicode map used by ByteLevel.
struct ByteMap {
  std::string byte_to_utf8[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp;
      if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = static_cast<uint32_t>(b);
      } else {
        cp = 256 + static_cast<uint32_t>(extra++);
      }
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
      }
      byte_to_utf8[b] = s;
      cp_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& Bytes() {
  static const ByteMap* m = new ByteMap();
  return *m;
}

// Splits a UTF-8 string into its characters (assumed valid).
std::vector<std::string_view> Chars(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Step st =
        DecodeStep(reinterpret_cast<const unsigned char*>(s.data() + i), s.size() - i);
    const size_t w = static_cast<size_t>(std::max(st.consumed, 1));
    out.push_back(s.substr(i, w));
    i += w;
  }
  return out;
}

uint32_t CodePoint(std::string_view c) {
  const auto* p = reinterpret_cast<const unsigned char*>(c.data());
  switch (c.size()) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1f) << 6) | (p[1] & 0x3f);
    case 3: return ((p[0] & 0x0f) << 12) | ((p[1] & 0x3f) << 6) | (p[2] & 0x3f);
    default: return ((p[0] & 0x07) << 18) | ((p[1] & 0x3f) << 12) | ((p[2] & 0x3f) << 6) | (p[3] & 0x3f);
  }
}

// ---- PCRE2 regex ----

class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern, bool literal) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP;
    if (literal) options |= PCRE2_LITERAL;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     options, &err, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return absl::InvalidArgumentError(absl::StrCat("tokenizer regex ", EchoValue(pattern, 96),
                                                     " does not compile at offset ", offset, ": ",
                                                     reinterpret_cast<const char*>(msg)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort; the interpreter is the fallback
    auto r = std::unique_ptr<Regex>(new Regex());
    r->code_ = code;
    return r;
  }
  ~Regex() { pcre2_code_free(code_); }

  // All non-overlapping matches [begin, end) in `s`.
  absl::Status FindAll(std::string_view s, std::vector<std::pair<size_t, size_t>>* out) const {
    out->clear();
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t start = 0;
    absl::Status status;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start,
                                 start == 0 ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        status = absl::InvalidArgumentError(
            absl::StrCat("tokenizer regex failed: ", reinterpret_cast<const char*>(msg)));
        break;
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {
        // Empty match: skip one character (none of DeepSeek's patterns can match empty).
        if (b >= s.size()) break;
        const Utf8Step st =
            DecodeStep(reinterpret_cast<const unsigned char*>(s.data() + b), s.size() - b);
        start = b + std::max(st.consumed, 1);
        continue;
      }
      out->emplace_back(b, e);
      start = e;
    }
    pcre2_match_data_free(md);
    return status;
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
};

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel } kind;
  std::unique_ptr<Regex> regex;  // split pattern, or ByteLevel's GPT-2 regex when use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct AddedToken {
  int32_t id;
  std::string content;
  bool special, lstrip, rstrip, single_word;
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

bool IsWordChar(std::string_view s, size_t pos, bool before) {
  // A letter, digit or underscore adjacent to a match (ASCII approximation plus any non-ASCII
  // character, as HF's single_word treats alphanumerics of any script as word characters).
  if (before) {
    if (pos == 0) return false;
    size_t p = pos - 1;
    while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xc0) == 0x80) --p;
    const unsigned char c = static_cast<unsigned char>(s[p]);
    return c >= 0x80 || std::isalnum(c) || c == '_';
  }
  if (pos >= s.size()) return false;
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  return c >= 0x80 || std::isalnum(c) || c == '_';
}

}  // namespace

// Typed fields of tokenizer.json objects with a default: a present field of another type is an
// error naming it (nlohmann's value() would throw).
absl::StatusOr<std::string> StringOr(const Json& obj, const char* key, const char* def,
                                     const std::string& where) {
  auto v = OptString(obj, key, absl::StrCat("tokenizer.json: ", where));
  if (!v.ok()) return v.status();
  return v->value_or(def);
}
absl::StatusOr<bool> BoolOr(const Json& obj, const char* key, bool def, const std::string& where) {
  auto v = OptBool(obj, key, absl::StrCat("tokenizer.json: ", where));
  if (!v.ok()) return v.status();
  return v->value_or(def);
}

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::map<std::pair<int32_t, int32_t>, std::pair<int32_t, int32_t>> merges;  // -> (rank, new id)
  std::vector<PreTokenizer> pre;
  std::vector<AddedToken> added;  // sorted by content length, longest first
  std::unordered_map<int32_t, size_t> added_by_id;
  // A byte trie over the added tokens' contents, so that finding the added tokens that start at a
  // position costs the length of the longest match, not a comparison with every added token.
  std::unordered_map<uint64_t, int32_t> trie_edges;  // node * 256 + byte -> child node
  std::vector<std::vector<size_t>> trie_ends;       // node -> indices into `added` ending there
  std::optional<int32_t> unk;
  bool ignore_merges = false;

  void BuildTrie() {
    trie_edges.clear();
    trie_ends.assign(1, {});
    for (size_t k = 0; k < added.size(); ++k) {
      int32_t node = 0;
      for (unsigned char c : added[k].content) {
        const uint64_t key = static_cast<uint64_t>(node) * 256 + c;
        auto it = trie_edges.find(key);
        if (it == trie_edges.end()) {
          it = trie_edges.emplace(key, static_cast<int32_t>(trie_ends.size())).first;
          trie_ends.emplace_back();
        }
        node = it->second;
      }
      trie_ends[node].push_back(k);
    }
  }

  // Added tokens whose content starts at text[i], longest first (file order among equals).
  void MatchesAt(std::string_view text, size_t i, std::vector<size_t>* out) const {
    out->clear();
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      auto it = trie_edges.find(static_cast<uint64_t>(node) * 256 + static_cast<unsigned char>(text[j]));
      if (it == trie_edges.end()) break;
      node = it->second;
      const auto& ends = trie_ends[node];
      out->insert(out->begin(), ends.begin(), ends.end());  // longer matches go first
    }
  }

  // Splits `text` into (added token id or -1, text) segments.
  void SplitAdded(std::string_view text, std::vector<std::pair<int32_t, std::string_view>>* out) const {
    size_t seg = 0, i = 0;
    std::vector<size_t> matches;
    while (i < text.size()) {
      MatchesAt(text, i, &matches);
      bool hit = false;
      for (size_t k : matches) {
        const AddedToken& t = added[k];
        size_t b = i, e = i + t.content.size();
        if (t.single_word && (IsWordChar(text, b, true) || IsWordChar(text, e, false))) continue;
        if (t.lstrip) {
          while (b > seg && std::isspace(static_cast<unsigned char>(text[b - 1]))) --b;
        }
        if (t.rstrip) {
          while (e < text.size() && std::isspace(static_cast<unsigned char>(text[e]))) ++e;
        }
        if (b > seg) out->emplace_back(-1, text.substr(seg, b - seg));
        out->emplace_back(t.id, text.substr(b, e - b));
        i = seg = e;
        hit = true;
        break;
      }
      if (!hit) ++i;
    }
    if (seg < text.size()) out->emplace_back(-1, text.substr(seg));
  }

  absl::Status ApplySplit(const PreTokenizer& p, const std::string& piece,
                          std::vector<std::string>* out) const {
    std::vector<std::pair<size_t, size_t>> m;
    RETURN_IF_ERROR(p.regex->FindAll(piece, &m));
    // (begin, end, is_delimiter) covering the piece.
    std::vector<std::tuple<size_t, size_t, bool>> parts;
    size_t last = 0;
    for (auto [b, e] : m) {
      if (b > last) parts.emplace_back(last, b, p.invert);
      parts.emplace_back(b, e, !p.invert);
      last = e;
    }
    if (last < piece.size()) parts.emplace_back(last, piece.size(), p.invert);
    std::vector<std::string> res;
    switch (p.behavior) {
      case SplitBehavior::kIsolated:
        for (auto [b, e, d] : parts) res.push_back(piece.substr(b, e - b));
        break;
      case SplitBehavior::kRemoved:
        for (auto [b, e, d] : parts) {
          if (!d) res.push_back(piece.substr(b, e - b));
        }
        break;
      case SplitBehavior::kMergedWithPrevious: {
        bool prev_is_gap = false;
        for (auto [b, e, d] : parts) {
          if (d && prev_is_gap && !res.empty()) {
            res.back() += piece.substr(b, e - b);
            prev_is_gap = false;
          } else {
            res.push_back(piece.substr(b, e - b));
            prev_is_gap = !d;
          }
        }
        break;
      }
      case SplitBehavior::kMergedWithNext: {
        bool prev_is_delim = false;
        for (auto [b, e, d] : parts) {
          if (!d && prev_is_delim && !res.empty()) {
            res.back() += piece.substr(b, e - b);
            prev_is_delim = false;
          } else {
            res.push_back(piece.substr(b, e - b));
            prev_is_delim = d;
          }
        }
        break;
      }
      case SplitBehavior::kContiguous: {
        bool prev_delim = false;
        for (auto [b, e, d] : parts) {
          if (d && prev_delim && !res.empty()) {
            res.back() += piece.substr(b, e - b);
          } else {
            res.push_back(piece.substr(b, e - b));
          }
          prev_delim = d;
        }
        break;
      }
    }
    for (auto& r : res) {
      if (!r.empty()) out->push_back(std::move(r));
    }
    return absl::OkStatus();
  }

  absl::Status PreTokenize(std::string_view text, std::vector<std::string>* pieces) const {
    pieces->assign(1, std::string(text));
    std::vector<std::string> next;
    for (const PreTokenizer& p : pre) {
      next.clear();
      for (const std::string& piece : *pieces) {
        if (p.kind == PreTokenizer::Kind::kSplit) {
          RETURN_IF_ERROR(ApplySplit(p, piece, &next));
          continue;
        }
        // ByteLevel: optional prefix space and GPT-2 split, then bytes -> unicode chars.
        std::string s = piece;
        if (p.add_prefix_space && (s.empty() || s[0] != ' ')) s.insert(s.begin(), ' ');
        std::vector<std::string> parts;
        if (p.regex != nullptr) {
          std::vector<std::pair<size_t, size_t>> m;
          RETURN_IF_ERROR(p.regex->FindAll(s, &m));
          size_t last = 0;
          for (auto [b, e] : m) {
            if (b > last) parts.push_back(s.substr(last, b - last));
            parts.push_back(s.substr(b, e - b));
            last = e;
          }
          if (last < s.size()) parts.push_back(s.substr(last));
        } else {
          parts.push_back(std::move(s));
        }
        for (const std::string& part : parts) {
          std::string mapped;
          for (unsigned char c : part) mapped += Bytes().byte_to_utf8[c];
          if (!mapped.empty()) next.push_back(std::move(mapped));
        }
      }
      pieces->swap(next);
    }
    return absl::OkStatus();
  }

  // BPE of one pre-tokenized piece (byte-level characters) into token ids.
  absl::Status Bpe(const std::string& piece, std::vector<int32_t>* out) const {
    if (ignore_merges) {
      if (auto it = vocab.find(piece); it != vocab.end()) {
        out->push_back(it->second);
        return absl::OkStatus();
      }
    }
    struct Sym {
      int32_t id;
      int prev, next;
      size_t len;  // bytes of the piece this symbol covers (for unk reporting)
    };
    std::vector<Sym> syms;
    for (std::string_view c : Chars(piece)) {
      auto it = vocab.find(std::string(c));
      if (it == vocab.end()) {
        if (!unk.has_value()) {
          return absl::InvalidArgumentError(
              absl::StrCat("tokenizer: character \"", std::string(c), "\" is not in the vocabulary "
                           "and the model has no unk_token"));
        }
        syms.push_back({*unk, static_cast<int>(syms.size()) - 1, static_cast<int>(syms.size()) + 1,
                        c.size()});
      } else {
        syms.push_back({it->second, static_cast<int>(syms.size()) - 1,
                        static_cast<int>(syms.size()) + 1, c.size()});
      }
    }
    if (syms.empty()) return absl::OkStatus();
    syms.back().next = -1;
    // Min-heap of (rank, position, left id, right id); stale entries are skipped.
    using Entry = std::tuple<int32_t, int, int32_t, int32_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    auto push = [&](int i) {
      const int j = syms[i].next;
      if (j < 0) return;
      auto it = merges.find({syms[i].id, syms[j].id});
      if (it != merges.end()) heap.emplace(it->second.first, i, syms[i].id, syms[j].id);
    };
    for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) push(i);
    std::vector<bool> dead(syms.size(), false);
    while (!heap.empty()) {
      auto [rank, i, a, b] = heap.top();
      heap.pop();
      if (dead[i] || syms[i].id != a) continue;
      const int j = syms[i].next;
      if (j < 0 || dead[j] || syms[j].id != b) continue;
      syms[i].id = merges.at({a, b}).second;
      syms[i].len += syms[j].len;
      syms[i].next = syms[j].next;
      if (syms[j].next >= 0) syms[syms[j].next].prev = i;
      dead[j] = true;
      if (syms[i].prev >= 0) push(syms[i].prev);
      push(i);
    }
    for (int i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
    return absl::OkStatus();
  }
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 512 << 20));
  auto tok = FromJson(text);
  if (!tok.ok()) return Annotate(tok.status(), path);
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text) {
  ASSIGN_OR_RETURN(Json j, ParseJson(json_text, "tokenizer.json"));
  auto bad = [](std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", AV(what)));
  };
  auto unsupported = [](std::string_view what) {
    return absl::UnimplementedError(absl::StrCat("tokenizer.json: ", AV(what), " is not supported"));
  };
  if (!j.is_object()) return bad("not a JSON object");
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  Impl& im = *tok->impl_;

  // Normalizer: none, or an empty Sequence.
  if (auto n = j.find("normalizer"); n != j.end() && !n->is_null()) {
    const bool empty_sequence = n->is_object() && n->contains("type") && (*n)["type"] == "Sequence" &&
                                n->contains("normalizers") && (*n)["normalizers"].is_array() &&
                                (*n)["normalizers"].empty();
    if (!empty_sequence) return unsupported("a normalizer");
  }

  // Model.
  auto model = j.find("model");
  if (model == j.end() || !model->is_object()) return bad("missing model");
  ASSIGN_OR_RETURN(const std::string model_type, StringOr(*model, "type", "BPE", "model"));
  if (model_type != "BPE") return unsupported("a non-BPE model");
  if (auto d = model->find("dropout"); d != model->end() && !d->is_null()) {
    return unsupported("BPE dropout");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (auto v = model->find(key); v != model->end() && !v->is_null() &&
                                   !(v->is_string() && v->get<std::string>().empty())) {
      return unsupported(key);
    }
  }
  if (auto v = model->find("byte_fallback"); v != model->end() && v->is_boolean() && v->get<bool>()) {
    return unsupported("byte_fallback");
  }
  ASSIGN_OR_RETURN(im.ignore_merges, BoolOr(*model, "ignore_merges", false, "model"));
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object() || vocab->empty()) {
    return bad("model.vocab must be a non-empty object");
  }
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24)) {
      return bad(absl::StrCat("model.vocab[", EchoValue(token), "] must be an id in [0, 2^24]"));
    }
    im.vocab[token] = static_cast<int32_t>(id.get<int64_t>());
    max_id = std::max(max_id, id.get<int64_t>());
  }

  // Added tokens.
  if (auto added = j.find("added_tokens"); added != j.end() && !added->is_null()) {
    if (!added->is_array()) return bad("added_tokens must be a list");
    for (size_t i = 0; i < added->size(); ++i) {
      const Json& a = (*added)[i];
      const std::string where = absl::StrCat("added_tokens[", i, "]");
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() ||
          a["content"].get<std::string>().empty()) {
        return bad(absl::StrCat(where, " needs an integer id and a non-empty content"));
      }
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id > (1 << 24)) return bad(absl::StrCat(where, ".id out of range"));
      ASSIGN_OR_RETURN(const bool special, BoolOr(a, "special", false, where));
      ASSIGN_OR_RETURN(const bool lstrip, BoolOr(a, "lstrip", false, where));
      ASSIGN_OR_RETURN(const bool rstrip, BoolOr(a, "rstrip", false, where));
      ASSIGN_OR_RETURN(const bool single_word, BoolOr(a, "single_word", false, where));
      AddedToken t{static_cast<int32_t>(id), a["content"].get<std::string>(), special, lstrip,
                   rstrip, single_word};
      if (!IsValidUtf8(t.content)) return bad(absl::StrCat(where, ".content is not UTF-8"));
      max_id = std::max(max_id, id);
      im.added.push_back(std::move(t));
    }
    std::stable_sort(im.added.begin(), im.added.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.content.size() > b.content.size();
    });
    for (size_t i = 0; i < im.added.size(); ++i) im.added_by_id[im.added[i].id] = i;
  }
  im.BuildTrie();

  tok->id_to_token_.assign(static_cast<size_t>(max_id + 1), "");
  for (const auto& [token, id] : im.vocab) tok->id_to_token_[id] = token;
  for (const AddedToken& t : im.added) tok->id_to_token_[t.id] = t.content;

  if (auto unk = model->find("unk_token"); unk != model->end() && unk->is_string()) {
    auto it = im.vocab.find(unk->get<std::string>());
    if (it == im.vocab.end()) return bad("model.unk_token is not in the vocabulary");
    im.unk = it->second;
  }

  // Merges: "a b" strings or [a, b] pairs, in rank order.
  if (auto merges = model->find("merges"); merges != model->end() && !merges->is_null()) {
    if (!merges->is_array()) return bad("model.merges must be a list");
    for (size_t r = 0; r < merges->size(); ++r) {
      const Json& m = (*merges)[r];
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size()) {
          return bad(absl::StrCat("model.merges[", r, "] is not \"a b\""));
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        return bad(absl::StrCat("model.merges[", r, "] must be a string or a pair of strings"));
      }
      auto ia = im.vocab.find(a), ib = im.vocab.find(b), iab = im.vocab.find(a + b);
      if (ia == im.vocab.end() || ib == im.vocab.end() || iab == im.vocab.end()) {
        return bad(absl::StrCat("model.merges[", r, "] uses a token missing from the vocabulary"));
      }
      im.merges.emplace(std::make_pair(ia->second, ib->second),
                        std::make_pair(static_cast<int32_t>(r), iab->second));
    }
  }

  // Pre-tokenizers.
  std::function<absl::Status(const Json&, const std::string&)> add_pre =
      [&](const Json& p, const std::string& where) -> absl::Status {
    if (!p.is_object()) return bad(absl::StrCat(where, " must be an object"));
    ASSIGN_OR_RETURN(const std::string type, StringOr(p, "type", "", where));
    if (type == "Sequence") {
      auto list = p.find("pretokenizers");
      if (list == p.end() || !list->is_array()) return bad(absl::StrCat(where, ".pretokenizers"));
      for (size_t i = 0; i < list->size(); ++i) {
        RETURN_IF_ERROR(add_pre((*list)[i], absl::StrCat(where, ".pretokenizers[", i, "]")));
      }
      return absl::OkStatus();
    }
    PreTokenizer pt;
    if (type == "Split") {
      pt.kind = PreTokenizer::Kind::kSplit;
      auto pattern = p.find("pattern");
      if (pattern == p.end() || !pattern->is_object()) return bad(absl::StrCat(where, ".pattern"));
      if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
        ASSIGN_OR_RETURN(pt.regex, Regex::Compile((*pattern)["Regex"].get<std::string>(), false));
      } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
        ASSIGN_OR_RETURN(pt.regex, Regex::Compile((*pattern)["String"].get<std::string>(), true));
      } else {
        return bad(absl::StrCat(where, ".pattern needs Regex or String"));
      }
      ASSIGN_OR_RETURN(const std::string behavior, StringOr(p, "behavior", "Isolated", where));
      static const std::map<std::string, SplitBehavior> kBehaviors = {
          {"Isolated", SplitBehavior::kIsolated},
          {"Removed", SplitBehavior::kRemoved},
          {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
          {"MergedWithNext", SplitBehavior::kMergedWithNext},
          {"Contiguous", SplitBehavior::kContiguous}};
      auto it = kBehaviors.find(behavior);
      if (it == kBehaviors.end()) return unsupported(absl::StrCat(where, ".behavior ", EchoValue(behavior)));
      pt.behavior = it->second;
      ASSIGN_OR_RETURN(pt.invert, BoolOr(p, "invert", false, where));
    } else if (type == "ByteLevel") {
      pt.kind = PreTokenizer::Kind::kByteLevel;
      ASSIGN_OR_RETURN(pt.add_prefix_space, BoolOr(p, "add_prefix_space", false, where));
      ASSIGN_OR_RETURN(const bool use_regex, BoolOr(p, "use_regex", true, where));
      if (use_regex) {
        ASSIGN_OR_RETURN(pt.regex, Regex::Compile(kGpt2Pattern, false));
      }
    } else {
      return unsupported(absl::StrCat(where, " of type ", EchoValue(type)));
    }
    im.pre.push_back(std::move(pt));
    return absl::OkStatus();
  };
  if (auto pre = j.find("pre_tokenizer"); pre != j.end() && !pre->is_null()) {
    RETURN_IF_ERROR(add_pre(*pre, "pre_tokenizer"));
  }
  if (im.pre.empty() || im.pre.back().kind != PreTokenizer::Kind::kByteLevel) {
    return unsupported("a pre_tokenizer that does not end with ByteLevel");
  }
  if (auto dec = j.find("decoder"); dec != j.end() && !dec->is_null()) {
    if (!dec->is_object() || !dec->contains("type") || (*dec)["type"] != "ByteLevel") {
      return unsupported("a decoder other than ByteLevel");
    }
  }
  // Bytes per token: every token covers its own bytes, unless whitespace stripping or a Removed
  // split makes a token stand for text it does not spell.
  bool unbounded = false;
  for (const AddedToken& t : im.added) unbounded |= t.lstrip || t.rstrip;
  for (const PreTokenizer& p : im.pre) unbounded |= p.behavior == SplitBehavior::kRemoved;
  if (!unbounded) {
    // A vocabulary token spells its bytes; an added token matches its content as written.
    for (int32_t id = 0; id < static_cast<int32_t>(tok->id_to_token_.size()); ++id) {
      const int64_t n = im.added_by_id.count(id) > 0
                            ? static_cast<int64_t>(tok->id_to_token_[id].size())
                            : static_cast<int64_t>(tok->TokenBytes(id).size());
      tok->max_bytes_per_token_ = std::max(tok->max_bytes_per_token_, n);
    }
  }
  return tok;
}

absl::StatusOr<std::vector<std::string>> Tokenizer::EncodePieces(std::string_view text) const {
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, Encode(text));
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(TokenString(id));
  return out;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  return Encode(text, std::numeric_limits<int64_t>::max());
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       int64_t max_tokens) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text is not valid UTF-8");
  auto too_many = [&] {
    return absl::OutOfRangeError(absl::StrCat("the text needs more than ", max_tokens, " tokens"));
  };
  if (max_bytes_per_token_ > 0 &&
      static_cast<int64_t>(text.size()) / max_bytes_per_token_ > max_tokens) {
    return too_many();
  }
  std::vector<std::pair<int32_t, std::string_view>> segments;
  impl_->SplitAdded(text, &segments);
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;
  for (const auto& [added, seg] : segments) {
    if (added >= 0) {
      ids.push_back(added);
    } else {
      RETURN_IF_ERROR(impl_->PreTokenize(seg, &pieces));
      for (const std::string& piece : pieces) {
        RETURN_IF_ERROR(impl_->Bpe(piece, &ids));
        if (static_cast<int64_t>(ids.size()) > max_tokens) return too_many();
      }
    }
    if (static_cast<int64_t>(ids.size()) > max_tokens) return too_many();
  }
  return ids;
}

std::string Tokenizer::TokenString(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) return "";
  return id_to_token_[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  for (const AddedToken& t : impl_->added) {
    if (t.content == token) return t.id;
  }
  auto it = impl_->vocab.find(std::string(token));
  if (it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size())) return "";
  // Every token, added ones included, goes through the ByteLevel decoder: mapped when each
  // character is a byte-level character, otherwise the token's own UTF-8 text (HF's fallback).
  const std::string& s = id_to_token_[id];
  std::string out;
  for (std::string_view c : Chars(s)) {
    auto it = Bytes().cp_to_byte.find(CodePoint(c));
    if (it == Bytes().cp_to_byte.end()) return s;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special_tokens && IsSpecial(id)) continue;
    bytes += TokenBytes(id);
  }
  return Utf8Lossy(bytes);
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Step st = DecodeStep(reinterpret_cast<const unsigned char*>(s.data() + i), s.size() - i);
    if (!st.valid) return false;
    i += st.consumed;
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Step st =
        DecodeStep(reinterpret_cast<const unsigned char*>(bytes.data() + i), bytes.size() - i);
    if (st.valid) {
      out.append(bytes.substr(i, st.consumed));
    } else {
      out.append(kReplacement);
    }
    i += static_cast<size_t>(std::max(st.consumed, 1));
  }
  return out;
}

size_t CompleteUtf8Prefix(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Step st =
        DecodeStep(reinterpret_cast<const unsigned char*>(bytes.data() + i), bytes.size() - i);
    if (st.incomplete) return i;
    i += static_cast<size_t>(std::max(st.consumed, 1));
  }
  return i;
}

std::string StreamDecoder::Push(int32_t id) {
  if (skip_special_ && tok_->IsSpecial(id)) return "";
  pending_ += tok_->TokenBytes(id);
  const size_t n = CompleteUtf8Prefix(pending_);
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::Finish() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv4
