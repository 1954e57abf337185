// Structured logging to stderr: one line per event, either logfmt (default) or JSON.
//   LogInfo("model_loaded", {{"layers", 6}, {"path", dir}});
// prints `ts=2026-11-29T21:41:00.123Z level=info event=model_loaded layers=6 path=/m`.
// Thread-safe: lines from concurrent threads never interleave.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace dsv4 {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

struct LogValue {
  LogValue(std::string_view s) : v(std::string(s)) {}
  LogValue(const std::string& s) : v(s) {}
  LogValue(const char* s) : v(std::string(s)) {}
  LogValue(bool b) : v(b) {}
  LogValue(int i) : v(static_cast<int64_t>(i)) {}
  LogValue(long i) : v(static_cast<int64_t>(i)) {}
  LogValue(long long i) : v(static_cast<int64_t>(i)) {}
  LogValue(unsigned i) : v(static_cast<int64_t>(i)) {}
  LogValue(unsigned long i) : v(static_cast<int64_t>(i)) {}
  LogValue(unsigned long long i) : v(static_cast<int64_t>(i)) {}
  LogValue(double d) : v(d) {}
  LogValue(float d) : v(static_cast<double>(d)) {}
  std::variant<std::string, int64_t, double, bool> v;
};

using LogFields = std::initializer_list<std::pair<std::string_view, LogValue>>;

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// JSON lines instead of logfmt.
void SetLogJson(bool json);
// Parses "debug|info|warning|error".
bool ParseLogLevel(std::string_view name, LogLevel* out);

void LogEvent(LogLevel level, std::string_view event, LogFields fields = {});
inline void LogDebug(std::string_view e, LogFields f = {}) { LogEvent(LogLevel::kDebug, e, f); }
inline void LogInfo(std::string_view e, LogFields f = {}) { LogEvent(LogLevel::kInfo, e, f); }
inline void LogWarning(std::string_view e, LogFields f = {}) { LogEvent(LogLevel::kWarning, e, f); }
inline void LogError(std::string_view e, LogFields f = {}) { LogEvent(LogLevel::kError, e, f); }

}  // namespace dsv4
