// The model tools of the dsv4-node executable: subcommands that drive a model on this process
// directly (the worker side), registered with main through common/cli_command.h so that the
// coordinator (node/) never includes them. Model-free header.
//   check-golden DIR   compare the engine with a transformers fixture
//   generate           generate tokens from prompt ids
//   bench              prefill/decode throughput of one worker
#pragma once

#include <memory>
#include <vector>

#include "common/cli_command.h"

namespace dsv4::cli {

std::unique_ptr<Command> AddCheckGolden(CLI::App& app);
std::unique_ptr<Command> AddGenerate(CLI::App& app);
std::unique_ptr<Command> AddBench(CLI::App& app);
std::unique_ptr<Command> AddWorker(CLI::App& app);  // worker/remote/worker_command.cc

// check-golden, generate, bench (in that order).
std::vector<CommandSpec> ModelToolCommands();

}  // namespace dsv4::cli
