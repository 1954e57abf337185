#include "common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dsv4 {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<bool> g_json{false};
std::mutex g_mu;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

std::string Timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm;
  gmtime_r(&secs, &tm);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
}

// Escapes for a JSON string body (also used for quoted logfmt values).
void AppendEscaped(std::string* out, std::string_view s) {
  for (unsigned char c : s) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (c < 0x20) {
          absl::StrAppend(out, absl::StrFormat("\\u%04x", c));
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
}

bool NeedsQuotes(std::string_view s) {
  if (s.empty()) return true;
  for (unsigned char c : s) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f) return true;
  }
  return false;
}

void AppendValue(std::string* out, const LogValue& value, bool json) {
  if (const auto* s = std::get_if<std::string>(&value.v)) {
    if (json || NeedsQuotes(*s)) {
      out->push_back('"');
      AppendEscaped(out, *s);
      out->push_back('"');
    } else {
      out->append(*s);
    }
  } else if (const auto* i = std::get_if<int64_t>(&value.v)) {
    absl::StrAppend(out, *i);
  } else if (const auto* d = std::get_if<double>(&value.v)) {
    absl::StrAppend(out, absl::StrFormat("%.6g", *d));
  } else {
    out->append(std::get<bool>(value.v) ? "true" : "false");
  }
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
void SetLogJson(bool json) { g_json.store(json); }

bool ParseLogLevel(std::string_view name, LogLevel* out) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (name == LevelName(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

void LogEvent(LogLevel level, std::string_view event, LogFields fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  const bool json = g_json.load();
  std::string line;
  if (json) {
    absl::StrAppend(&line, "{\"ts\":\"", Timestamp(), "\",\"level\":\"", LevelName(level),
                    "\",\"event\":");
    AppendValue(&line, LogValue(event), true);
    for (const auto& [key, value] : fields) {
      line.append(",\"");
      AppendEscaped(&line, key);
      line.append("\":");
      AppendValue(&line, value, true);
    }
    line.append("}\n");
  } else {
    absl::StrAppend(&line, "ts=", Timestamp(), " level=", LevelName(level), " event=");
    AppendValue(&line, LogValue(event), false);
    for (const auto& [key, value] : fields) {
      line.push_back(' ');
      line.append(key);
      line.push_back('=');
      AppendValue(&line, value, false);
    }
    line.push_back('\n');
  }
  std::lock_guard<std::mutex> lock(g_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace dsv4
