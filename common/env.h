// Switches read from the environment (debugging and A/B kill switches of the GPU worker). A set
// variable must hold one of the values the switch names; anything else is an error that names the
// variable and the accepted values, never a silent default.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"

namespace dsv4 {

// The index in `values` of the variable `name`'s value, or `unset` when it is not set.
absl::StatusOr<int> EnvChoice(const char* name, std::initializer_list<std::string_view> values,
                              int unset);

// EnvChoice with the values "0" and "1": false for "0", true for "1", `unset` when not set.
absl::StatusOr<bool> EnvBool(const char* name, bool unset);

// A comma-separated subset of `values` (at most 32) as a bit set: bit i for values[i]; 0 when the
// variable is not set or empty. An unknown or empty item is an error naming the variable, the
// item and the accepted values.
absl::StatusOr<uint32_t> EnvSubset(const char* name, std::span<const std::string_view> values);

}  // namespace dsv4
