#include "control/secret.h"

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/status.h"

#ifndef DSV4_BUILD_VERSION
#define DSV4_BUILD_VERSION "dev"
#endif

namespace dsv4::control {

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, std::string_view flag) {
  auto text = ReadFileToString(path, 4096);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(AV(flag), ": ", text.status().message()));
  }
  std::string s = std::move(*text);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) return absl::InvalidArgumentError(absl::StrCat(AV(flag), ": ", path, " is empty"));
  return s;
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

const char* BuildVersion() { return "control-v1 " DSV4_BUILD_VERSION; }

}  // namespace dsv4::control
