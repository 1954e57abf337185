// Status helpers shared by every module.
//
// Debian 12 ships Abseil 20220623, which has neither absl/log nor ABSL_RETURN_IF_ERROR. These
// macros keep the same names and semantics so that they can become aliases later.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace dsv4 {

// Debian's Abseil 20220623 is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW
// is 0), which StrCat and Status do not convert from std::string_view. AV() bridges the two.
inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Returns `status` with `context` prepended to its message; the code is kept. OK stays OK.
inline absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(AV(context), ": ", status.message()));
}

namespace internal {
inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

}  // namespace dsv4

#define DSV4_STATUS_CONCAT_INNER(a, b) a##b
#define DSV4_STATUS_CONCAT(a, b) DSV4_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (a Status or StatusOr) and returns its status from the enclosing function when
// it is not OK.
#define RETURN_IF_ERROR(expr)                                                      \
  do {                                                                             \
    const ::absl::Status dsv4_status_ = ::dsv4::internal::AsStatus((expr));        \
    if (!dsv4_status_.ok()) return dsv4_status_;                                   \
  } while (0)

// Like RETURN_IF_ERROR, but prefixes the message with `context` (a string expression).
#define RETURN_IF_ERROR_CTX(expr, context)                                          \
  do {                                                                              \
    const ::absl::Status dsv4_status_ = ::dsv4::internal::AsStatus((expr));         \
    if (!dsv4_status_.ok()) return ::dsv4::Annotate(dsv4_status_, (context));       \
  } while (0)

#define DSV4_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

// ASSIGN_OR_RETURN(auto x, MakeX()); declares or assigns `lhs` from a StatusOr, returning the
// error status from the enclosing function on failure.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  DSV4_ASSIGN_OR_RETURN_IMPL(DSV4_STATUS_CONCAT(dsv4_statusor_, __COUNTER__), lhs, rexpr)
