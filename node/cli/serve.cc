// dsv4-node serve: the serving node. gRPC (dsv4.v1 + health + reflection) and Prometheus on their
// own ports; ready only after the model is loaded and a warm-up request ran; SIGTERM/SIGINT
// drain: stop accepting, let in-flight requests finish within --drain-timeout, cancel the rest,
// exit 0.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/log.h"
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "node/serving_node.h"

namespace dsv4::cli {
namespace {

class Serve final : public Command {
 public:
  explicit Serve(CLI::App& app) {
    flags_.Register(app);
    app.add_option("--tokenizer", o_.tokenizer_path, "tokenizer.json (default: <model>/tokenizer.json)");
    app.add_option("--listen", o_.listen, "gRPC address HOST:PORT (port 0 = any free port)");
    app.add_option("--metrics-listen", o_.metrics_listen, "Prometheus /metrics address HOST:PORT");
    app.add_option("--port-file", port_file_,
                   "write {\"grpc\": PORT, \"metrics\": PORT} here once listening");
    app.add_option("--max-model-len", o_.max_model_len,
                   "longest sequence (0 = the model's limit, capped at 8192)")
        ->check(CLI::Range(0, 1 << 30));
    app.add_option("--max-num-seqs", o_.max_num_seqs, "requests running at once")
        ->check(CLI::Range(1, 4096));
    app.add_option("--max-batched-tokens", o_.max_batched_tokens, "token budget per step")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--max-prefill-chunk", o_.max_prefill_chunk, "largest prefill chunk (0 = budget)")
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("--kv-blocks", o_.kv_blocks,
                   "KV context blocks (0 = max-num-seqs x max-model-len worth)")
        ->check(CLI::Range(0, 1 << 24));
    app.add_option("--max-waiting", o_.max_waiting, "queued requests before RESOURCE_EXHAUSTED")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--default-max-tokens", o_.default_max_tokens,
                   "max_tokens when a request sets none")
        ->check(CLI::Range(1, 1 << 30));
    app.add_option("--repetition-action", repetition_action_, "observe|stop|off")
        ->check(CLI::IsMember({"observe", "stop", "off"}));
    app.add_option("--repetition-max-period", o_.repetition.max_period, "longest repeating block")
        ->check(CLI::Range(1, 4096));
    app.add_option("--repetition-min-count", o_.repetition.min_count, "repeats that count")
        ->check(CLI::Range(2, 1 << 20));
    app.add_option("--repetition-min-tokens", o_.repetition.min_tokens, "shortest repeating span")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--cudagraph-mode", o_.cudagraph_mode,
                   "CUDA graphs on the GPU worker: none|piecewise|full|full_decode_only|"
                   "full_and_piecewise (FULL graphs for decode batches, piecewise for the rest)");
    app.add_option("--cudagraph-capture-sizes", o_.cudagraph_capture_sizes,
                   "graph batch sizes in tokens, e.g. 1,2,4,8 (default 1,2,4,8,16,24,...,512 up "
                   "to --max-batched-tokens); larger steps run eagerly");
    app.add_flag("--enforce-eager", o_.enforce_eager,
                 "kill switch: no CUDA graphs (the same as --cudagraph-mode none)");
    app.add_option("--overlap-steps", o_.overlap,
                   "plan and launch the next decode step while one runs: auto (when the worker "
                   "supports it: the GPU worker)|on|off")
        ->check(CLI::IsMember({"auto", "on", "off"}));
    app.add_option("--drain-timeout", drain_timeout_s_, "seconds in-flight requests get on SIGTERM")
        ->check(CLI::Range(0.0, 3600.0));
  }

  int Run() override {
    // Block the termination signals in every thread started from here; the main thread waits
    // for them with sigwait.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    if (flags_.synthetic_config.empty()) {
      auto dir = flags_.ResolveModelDir();
      if (!dir.ok()) return Fail(dir.status());
      o_.model_dir = *dir;
    } else if (o_.tokenizer_path.empty()) {
      return Fail(absl::InvalidArgumentError("--synthetic-config needs --tokenizer"));
    }
    o_.synthetic_config = flags_.synthetic_config;
    o_.seed = flags_.seed;
    o_.device = flags_.device;
    o_.precision = flags_.precision;
    o_.threads = flags_.threads;
    o_.block_size = flags_.block_size;
    o_.force_indexer_scoring = flags_.force_indexer_scoring;
    o_.repetition_mode = repetition_action_ == "stop"   ? RepetitionMode::kStop
                         : repetition_action_ == "off" ? RepetitionMode::kOff
                                                       : RepetitionMode::kObserve;
    auto node = ServingNode::Start(o_);
    if (!node.ok()) return Fail(node.status());
    if (!port_file_.empty()) {
      std::ofstream f(port_file_ + ".tmp");
      f << "{\"grpc\": " << (*node)->grpc_port() << ", \"metrics\": " << (*node)->metrics_port()
        << "}\n";
      f.close();
      std::rename((port_file_ + ".tmp").c_str(), port_file_.c_str());
    }
    int sig = 0;
    sigwait(&signals, &sig);
    LogInfo("draining", {{"signal", sig}, {"timeout_seconds", drain_timeout_s_}});
    const bool drained =
        (*node)->Drain(std::chrono::milliseconds(static_cast<int64_t>(drain_timeout_s_ * 1000)));
    (*node)->Shutdown();
    LogInfo("stopped", {{"drained", drained}});
    return 0;
  }

 private:
  ModelFlags flags_;
  NodeOptions o_;
  std::string port_file_;
  std::string repetition_action_ = "observe";
  double drain_timeout_s_ = 30;
};

}  // namespace

std::unique_ptr<Command> AddServe(CLI::App& app) { return std::make_unique<Serve>(app); }

}  // namespace dsv4::cli
