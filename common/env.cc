#include "common/env.h"

#include <cstdlib>

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dsv4 {

namespace {

// values[i] == v: i, else -1.
int IndexOf(std::span<const std::string_view> values, std::string_view v) {
  int i = 0;
  for (std::string_view accepted : values) {
    if (accepted == v) return i;
    ++i;
  }
  return -1;
}

std::string Joined(std::span<const std::string_view> values) {
  std::string accepted;
  for (std::string_view a : values) {
    if (!accepted.empty()) accepted += ", ";
    accepted += a;
  }
  return accepted;
}

}  // namespace

absl::StatusOr<int> EnvChoice(const char* name, std::initializer_list<std::string_view> values,
                              int unset) {
  const char* v = std::getenv(name);
  if (v == nullptr) return unset;
  const std::span<const std::string_view> all(values.begin(), values.size());
  if (const int i = IndexOf(all, v); i >= 0) return i;
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", name, "='", v, "': expected one of ", Joined(all)));
}

absl::StatusOr<uint32_t> EnvSubset(const char* name, std::span<const std::string_view> values) {
  if (values.size() > 32) return absl::InternalError("EnvSubset: more than 32 values");
  const char* v = std::getenv(name);
  uint32_t bits = 0;
  if (v == nullptr || *v == '\0') return bits;
  for (absl::string_view piece : absl::StrSplit(v, ',')) {
    const std::string item(piece.data(), piece.size());
    const int i = IndexOf(values, item);
    if (i < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, "='", v, "': unknown item '", item,
                       "'; expected a comma-separated list of ", Joined(values)));
    }
    bits |= uint32_t{1} << i;
  }
  return bits;
}

absl::StatusOr<bool> EnvBool(const char* name, bool unset) {
  absl::StatusOr<int> i = EnvChoice(name, {"0", "1"}, unset ? 1 : 0);
  if (!i.ok()) return i.status();
  return *i == 1;
}

}  // namespace dsv4
