// Field access on the OpenAI request bodies (request.cc, chat_request.cc): errors are
// InvalidArgument whose message starts with the field's path, as the API's 400s name it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json_util.h"

namespace dsv4::openai {

using Json = nlohmann::ordered_json;

inline absl::Status Invalid(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

inline absl::Status WrongType(const std::string& field, const char* want, const Json& got) {
  return Invalid(field, absl::StrCat("must be ", want, ", got ", JsonTypeName(got)));
}

// A present, non-null member, or null.
inline const Json* Member(const Json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace dsv4::openai
