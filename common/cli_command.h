// A subcommand of the dsv4-node executable, as main() sees it: the coordinator's commands
// (node/cli/commands.h) and the model tools (worker/tools/model_tools.h) both register through
// this, so that main dispatches to either without the coordinator including model code.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"

namespace dsv4::cli {

// Registers its flags on a CLI11 subcommand in its constructor; Run() is called when that
// subcommand was selected and returns the process exit code.
class Command {
 public:
  virtual ~Command() = default;
  virtual int Run() = 0;
};

// One subcommand: its name, its help line, and the function that registers it.
struct CommandSpec {
  const char* name;
  const char* help;
  std::function<std::unique_ptr<Command>(CLI::App&)> add;
};

// Prints "error: <status>" to stderr and returns 1.
inline int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace dsv4::cli
