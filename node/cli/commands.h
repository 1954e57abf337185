// The coordinator's subcommands of the dsv4-node executable (serve, client, loadgen). Each
// registers its flags on the CLI11 app and returns the process exit code from Run()
// (common/cli_command.h). The model tools are the worker side's (worker/tools/model_tools.h).
#pragma once

#include <memory>
#include <vector>

#include "common/cli_command.h"
#include "worker/worker.h"

namespace dsv4::cli {

// serve builds its worker with `workers` (the in-process one: CreateInProcessWorker).
std::unique_ptr<Command> AddServe(CLI::App& app, WorkerFactory workers);
std::unique_ptr<Command> AddClient(CLI::App& app);
std::unique_ptr<Command> AddLoadgen(CLI::App& app);

// serve, client, loadgen (in that order).
std::vector<CommandSpec> CoordinatorCommands(WorkerFactory workers);

}  // namespace dsv4::cli
