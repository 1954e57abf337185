#include "common/env.h"

#include <cstdlib>

#include <string>

#include "absl/strings/str_cat.h"

namespace dsv4 {

absl::StatusOr<int> EnvChoice(const char* name, std::initializer_list<std::string_view> values,
                              int unset) {
  const char* v = std::getenv(name);
  if (v == nullptr) return unset;
  int i = 0;
  for (std::string_view accepted : values) {
    if (accepted == v) return i;
    ++i;
  }
  std::string accepted;
  for (std::string_view a : values) {
    if (!accepted.empty()) accepted += ", ";
    accepted += a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", name, "='", v, "': expected one of ", accepted));
}

absl::StatusOr<bool> EnvBool(const char* name, bool unset) {
  absl::StatusOr<int> i = EnvChoice(name, {"0", "1"}, unset ? 1 : 0);
  if (!i.ok()) return i.status();
  return *i == 1;
}

}  // namespace dsv4
