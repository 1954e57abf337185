// Flags shared by subcommands that load a model on this process.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "worker/model/dsv4_model.h"

namespace dsv4::cli {

struct ModelFlags {
  std::string model_dir;  // "" = the embedded default model
  std::string device = "cpu";
  int threads = 0;        // BLAS threads; 0 = library default
  int block_size = 0;
  bool force_indexer_scoring = false;

  void Register(CLI::App& app);
  // Resolves the model directory (error if none is found).
  absl::StatusOr<std::string> ResolveModelDir() const;
  // Loads config + checkpoint and builds the model with room for `slots` sequences of up to
  // `max_len` tokens.
  absl::StatusOr<std::unique_ptr<Dsv4Model>> Load(int slots, int64_t max_len) const;
};

// Prints "error: <status>" to stderr and returns 1.
int Fail(const absl::Status& status);

}  // namespace dsv4::cli
