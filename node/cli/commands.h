// Subcommands of the dsv4-node executable. Each registers its flags on the CLI11 app and returns
// the process exit code from Run().
#pragma once

#include <CLI/CLI.hpp>

namespace dsv4::cli {

// Registers a subcommand; the returned object's Run() is called when it was selected.
class Command {
 public:
  virtual ~Command() = default;
  virtual int Run() = 0;
};

std::unique_ptr<Command> AddCheckGolden(CLI::App& app);
std::unique_ptr<Command> AddGenerate(CLI::App& app);
std::unique_ptr<Command> AddBench(CLI::App& app);
std::unique_ptr<Command> AddServe(CLI::App& app);
std::unique_ptr<Command> AddClient(CLI::App& app);
std::unique_ptr<Command> AddLoadgen(CLI::App& app);

}  // namespace dsv4::cli
