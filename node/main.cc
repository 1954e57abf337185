// dsv4-node: one executable with subcommands. The model tools come from the worker side
// (worker/tools/model_tools.h), the others from the coordinator (node/cli/commands.h); this file
// is the one place that joins both (the executable links the coordinator and the worker).
//   check-golden DIR   compare the engine with a transformers fixture
//   generate           generate tokens from prompt ids
//   bench              CPU prefill/decode throughput of a model
//   serve              the serving node (gRPC + Prometheus)
//   worker             one rank of a distributed node (--tensor-parallel-size N)
//   client             stream one generation from a running node
//   loadgen            closed-loop load against a running node
#include <cstdio>
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "node/cli/commands.h"
#include "worker/in_process_worker.h"
#include "worker/tools/model_tools.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv4-node: a serving node for DeepSeek-V4 models"};
  app.require_subcommand(1);
  std::string log_level = "info";
  bool log_json = false;
  app.add_option("--log-level", log_level, "debug|info|warning|error")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));
  app.add_flag("--log-json", log_json, "structured logs as JSON lines");
  // Flags may also come from a TOML file with one [subcommand] section (the Kubernetes ConfigMap).
  app.set_config("--config", "", "TOML file of flags: a [serve] section holds serve's flags");
  // A misspelt key in a config file is an error, not silently ignored (subcommands inherit it).
  app.allow_config_extras(CLI::config_extras_mode::error);
  std::vector<std::pair<CLI::App*, std::unique_ptr<dsv4::cli::Command>>> commands;
  // The model tools (the worker side) and the coordinator's commands; serve runs the in-process
  // worker.
  std::vector<dsv4::cli::CommandSpec> specs = dsv4::cli::ModelToolCommands();
  for (dsv4::cli::CommandSpec& spec : dsv4::cli::CoordinatorCommands(dsv4::CreateInProcessWorker)) {
    specs.push_back(std::move(spec));
  }
  for (const dsv4::cli::CommandSpec& spec : specs) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    sub->fallthrough();  // global flags (--log-level, ...) may follow the subcommand
    commands.emplace_back(sub, spec.add(*sub));
  }
  // A mistyped command gets named rather than "a subcommand is required".
  auto known = [&](const char* word) {
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->get_name() == word) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
    std::fprintf(stderr, "error: unknown command '%s' (commands: serve, worker, client, loadgen, check-golden, generate, bench; "
                 "see --help)\n", argv[1]);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  dsv4::LogLevel level;
  dsv4::ParseLogLevel(log_level, &level);
  dsv4::SetLogLevel(level);
  dsv4::SetLogJson(log_json);
  for (auto& [sub, command] : commands) {
    if (sub->parsed()) return command->Run();
  }
  return 2;
}
