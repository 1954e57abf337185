#include "common/json_util.h"

#include <unistd.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>

#include <set>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/mapped_file.h"
#include "common/status.h"

namespace dsv4 {
namespace {


std::string Where(std::string_view where, std::string_view key) {
  return where.empty() ? std::string(key) : absl::StrCat(AV(where), ".", AV(key));
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot size ", path));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", st.st_size, " bytes, more than the limit of ", max_bytes));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot read ", path));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what, int max_depth) {
  if (!JsonNestingWithin(text, max_depth)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(what), ": JSON nested deeper than ", max_depth, " levels"));
  }
  // nlohmann keeps the last of duplicate keys silently; a document with duplicates is ambiguous
  // (two tensors of one name, two values of one field), so it is rejected.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json parsed = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(AV(what), ": not valid JSON"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(what), ": duplicate key \"", absl::CEscape(duplicate), "\""));
  }
  return parsed;
}

absl::StatusOr<int64_t> JsonToInt(const Json& value, std::string_view what) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned()) {
      const uint64_t u = value.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return absl::InvalidArgumentError(absl::StrCat(AV(what), " is out of range"));
      }
      return static_cast<int64_t>(u);
    }
    return value.get<int64_t>();
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(AV(what), " must be an integer"));
}

absl::StatusOr<std::optional<int64_t>> OptInt(const Json& obj, std::string_view key,
                                              std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>();
  auto v = JsonToInt(*it, Where(where, key));
  if (!v.ok()) return v.status();
  return std::optional<int64_t>(*v);
}

absl::StatusOr<std::optional<double>> OptDouble(const Json& obj, std::string_view key,
                                                std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(where, key), " must be a number"));
  }
  const double d = it->get<double>();
  if (!std::isfinite(d)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(where, key), " must be finite"));
  }
  return std::optional<double>(d);
}

absl::StatusOr<std::optional<bool>> OptBool(const Json& obj, std::string_view key,
                                            std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(where, key), " must be a boolean"));
  }
  return std::optional<bool>(it->get<bool>());
}

absl::StatusOr<std::optional<std::string>> OptString(const Json& obj, std::string_view key,
                                                     std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(where, key), " must be a string"));
  }
  return std::optional<std::string>(it->get<std::string>());
}

bool JsonNestingWithin(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace dsv4
