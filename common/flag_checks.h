// Validators for command-line numbers that CLI11's Range lets through: NaN compares false with
// both bounds, so `--drain-timeout nan` passed CLI::Range(0.0, 3600.0).
#pragma once

#include <cmath>
#include <string>

#include <CLI/CLI.hpp>

namespace dsv4::cli {

inline CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (end == value.c_str() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) {
          return "must be a number in [" + CLI::detail::to_string(lo) + ", " +
                 CLI::detail::to_string(hi) + "], got " + value;
        }
        return "";
      },
      "FLOAT in [" + CLI::detail::to_string(lo) + " - " + CLI::detail::to_string(hi) + "]");
}

}  // namespace dsv4::cli
