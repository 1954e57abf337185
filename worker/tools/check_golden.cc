// dsv4-node check-golden DIR [--tensor-parallel-size N]: compares the engine with a transformers
// fixture directory, on one process or on N tensor-parallel rank processes (local_ranks.h).
#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/strings/str_format.h"
#include "kernels/cpu_gemm.h"
#include "common/cli_command.h"
#include "common/tensor_parallel.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/tools/golden_check.h"
#include "worker/tools/local_ranks.h"
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
    app.add_option("--tensor-parallel-size", tp_,
                   "run the fixture on N CPU rank processes (heads and experts split, Gloo)")
        ->check(CLI::Range(1, 64));
    // Set by rank 0 for the ranks it starts (local_ranks.h); not for users.
    app.add_option("--tp-join", tp_join_)->group("");
    app.add_option("--tp-rank", tp_rank_)->group("");
  }

  int Run() override {
    SetBlasThreads(threads_);
    GoldenOptions options;
    options.cache.block_size = block_size_;
    options.force_indexer_scoring = force_scoring_;
    options.batched = !no_batched_;
    if (!tp_join_.empty()) return RunRank(options);
    std::unique_ptr<LocalRanks> ranks;
    if (tp_ > 1) {
      auto config = LoadModelConfig(dir_ + "/config.json");
      if (!config.ok()) return Fail(config.status());
      if (auto s = CheckTensorParallel(*config, tp_); !s.ok()) return Fail(s);
      auto started = LocalRanks::Start(tp_, OwnCommandLine());
      if (!started.ok()) return Fail(started.status());
      ranks = std::move(*started);
      Communicator* comm = &ranks->comm();
      options.make_backend = [comm] { return std::make_unique<CpuBackend>(comm); };
      options.load.parallel = {0, tp_};
    }
    auto report = RunGoldenCheck(dir_, options);
    if (!report.ok()) return Fail(report.status());
    absl::Status ranks_done = ranks ? ranks->Wait(120) : absl::OkStatus();
    for (const GoldenItem& item : report->items) {
      std::printf("%-28s max_abs_err=%.3e  %s%s%s\n", item.name.c_str(), item.max_abs,
                  item.pass ? "PASS" : "FAIL", item.detail.empty() ? "" : "  ",
                  item.detail.c_str());
    }
    const bool pass = report->pass() && ranks_done.ok();
    std::printf("%s: %zu items, max_abs_err=%.3e, tolerance=%.1e%s\n", pass ? "PASS" : "FAIL",
                report->items.size(), report->max_abs(), report->tolerance,
                tp_ > 1 ? absl::StrFormat(", tensor_parallel_size=%d", tp_).c_str() : "");
    if (!ranks_done.ok()) std::fprintf(stderr, "error: %s\n", std::string(ranks_done.message()).c_str());
    return pass ? 0 : 1;
  }

 private:
  // A rank rank 0 started: the same check on this rank's slices, silent; the exit status says
  // whether it passed.
  int RunRank(GoldenOptions options) {
    auto comm = LocalRanks::Join(tp_join_, tp_rank_, tp_);
    if (!comm.ok()) return Fail(comm.status());
    Communicator* c = comm->get();
    options.make_backend = [c] { return std::make_unique<CpuBackend>(c); };
    options.load.parallel = {tp_rank_, tp_};
    auto report = RunGoldenCheck(dir_, options);
    if (!report.ok()) {
      return Fail(absl::Status(report.status().code(),
                               absl::StrCat("rank ", tp_rank_, ": ", report.status().message())));
    }
    return report->pass() ? 0 : 1;
  }
  static std::vector<std::string> OwnCommandLine() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    std::string cur;
    for (char ch : all) {
      if (ch == '\0') {
        args.push_back(cur);
        cur.clear();
      } else {
        cur += ch;
      }
    }
    return args;
  }

  std::string dir_;
  int threads_ = 0;
  int block_size_ = 0;
  bool force_scoring_ = false;
  bool no_batched_ = false;
  int tp_ = 1;
  std::string tp_join_;
  int tp_rank_ = 0;
};

}  // namespace

std::unique_ptr<Command> AddCheckGolden(CLI::App& app) { return std::make_unique<CheckGolden>(app); }

}  // namespace dsv4::cli
