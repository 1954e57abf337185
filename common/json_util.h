// Defensive JSON helpers around nlohmann::json: parsing never throws or recurses without bound,
// and typed field access returns a Status that names the offending field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace dsv4 {

using Json = nlohmann::json;

// Reads a whole file; fails with NotFound / InvalidArgument (too large) / Internal.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes);

// "an object", "an array", "a string", "a boolean", "a number" or "null": a value's kind in an
// error message ("must be a string, got a number"). For nlohmann::json and ordered_json alike.
template <class J>
const char* JsonTypeName(const J& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  return "null";
}

// Whether arrays/objects in `text` nest at most `max_depth` deep (counted outside string literals,
// without parsing): a check before a parser or a walk that recurses sees hostile input.
bool JsonNestingWithin(std::string_view text, int max_depth);

// Parses `text`. `what` names the document in error messages ("config.json"). Nesting deeper than
// `max_depth` is rejected before the parser sees it, so hostile input cannot exhaust the stack.
absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what, int max_depth = 64);

// Field access on a JSON object. Absent or null fields give nullopt; a present field of the wrong
// type (or an integer out of range) gives InvalidArgument naming `where`.`key`.
absl::StatusOr<std::optional<int64_t>> OptInt(const Json& obj, std::string_view key,
                                              std::string_view where);
absl::StatusOr<std::optional<double>> OptDouble(const Json& obj, std::string_view key,
                                                std::string_view where);
absl::StatusOr<std::optional<bool>> OptBool(const Json& obj, std::string_view key,
                                            std::string_view where);
absl::StatusOr<std::optional<std::string>> OptString(const Json& obj, std::string_view key,
                                                     std::string_view where);

// Integer value of a JSON number that must be integral (3 or 3.0); error names `what`.
absl::StatusOr<int64_t> JsonToInt(const Json& value, std::string_view what);

}  // namespace dsv4
