// dsv4-node check-golden DIR: compares the engine with a transformers fixture directory.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "kernels/cpu_gemm.h"
#include "common/cli_command.h"
#include "worker/tools/golden_check.h"
#include "worker/tools/model_tools.h"

namespace dsv4::cli {
namespace {

class CheckGolden final : public Command {
 public:
  explicit CheckGolden(CLI::App& app) {
    app.add_option("dir", dir_, "fixture directory (config.json, model.safetensors, golden.json, "
                                "golden.safetensors)")
        ->required();
    app.add_option("--threads", threads_, "BLAS threads (0 = default)")->check(CLI::Range(0, 1024));
    app.add_option("--block-size", block_size_, "tokens per KV block (0 = default)")
        ->check(CLI::Range(0, 1 << 16));
    app.add_flag("--force-indexer-scoring", force_scoring_,
                 "always score the lightning indexer (disable the short-context shortcut)");
    app.add_flag("--no-batched", no_batched_, "skip the all-prompts-in-one-batch items");
  }

  int Run() override {
    SetBlasThreads(threads_);
    GoldenOptions options;
    options.cache.block_size = block_size_;
    options.force_indexer_scoring = force_scoring_;
    options.batched = !no_batched_;
    auto report = RunGoldenCheck(dir_, options);
    if (!report.ok()) return Fail(report.status());
    for (const GoldenItem& item : report->items) {
      std::printf("%-28s max_abs_err=%.3e  %s%s%s\n", item.name.c_str(), item.max_abs,
                  item.pass ? "PASS" : "FAIL", item.detail.empty() ? "" : "  ",
                  item.detail.c_str());
    }
    std::printf("%s: %zu items, max_abs_err=%.3e, tolerance=%.1e\n",
                report->pass() ? "PASS" : "FAIL", report->items.size(), report->max_abs(),
                report->tolerance);
    return report->pass() ? 0 : 1;
  }

 private:
  std::string dir_;
  int threads_ = 0;
  int block_size_ = 0;
  bool force_scoring_ = false;
  bool no_batched_ = false;
};

}  // namespace

std::unique_ptr<Command> AddCheckGolden(CLI::App& app) { return std::make_unique<CheckGolden>(app); }

}  // namespace dsv4::cli
