// The control plane's shared secret (--worker-secret-file): a worker proves it belongs by sending
// the file's bytes in Register; the coordinator compares them in constant time.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace dsv4::control {

// Reads a secret file (as Kubernetes mounts a Secret): trailing newlines are dropped; an empty,
// unreadable or oversized (> 4 KiB) file is an error naming `flag` and the path.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, std::string_view flag);

// Equal bytes, in time that depends only on the lengths.
bool SecretsEqual(std::string_view a, std::string_view b);

// The version a worker must match to join (the control plane's wire version and this build's).
const char* BuildVersion();

}  // namespace dsv4::control
