// dsv4-node serve: the serving node. gRPC (dsv4.v1 + health + reflection), Prometheus and (with
// --http-listen) the OpenAI-compatible HTTP API on their own ports; ready only after the model is loaded and a warm-up request ran; SIGTERM/SIGINT
// drain: stop accepting, let in-flight requests finish within --drain-timeout, cancel the rest,
// exit 0 (repeated signals: shutdown_signals.h).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/flag_checks.h"
#include "common/log.h"
#include "common/status.h"
#include "common/model_flags.h"
#include "node/cli/commands.h"
#include "control/secret.h"
#include "node/cli/shutdown_signals.h"
#include "node/control/remote_worker_group.h"
#include "node/serving_node.h"
#include "parallel/rendezvous_store.h"

namespace dsv4::cli {
namespace {

class Serve final : public Command {
 public:
  Serve(CLI::App& app, WorkerFactory workers) {
    o_.worker_factory = std::move(workers);
    flags_.Register(app);
    app.add_option("--tokenizer", o_.tokenizer_path, "tokenizer.json (default: <model>/tokenizer.json)");
    app.add_option("--listen", o_.listen, "gRPC address HOST:PORT (port 0 = any free port)");
    app.add_option("--metrics-listen", o_.metrics_listen, "Prometheus /metrics address HOST:PORT");
    app.add_option("--port-file", port_file_,
                   "write {\"grpc\": PORT, \"metrics\": PORT, \"http\": PORT} here once "
                   "listening (http 0 without --http-listen)");
    app.add_option("--http-listen", o_.http_listen,
                   "OpenAI-compatible HTTP API address HOST:PORT (/v1/chat/completions, "
                   "/v1/completions, /v1/models, /health); off unless given; TLS with --tls-*");
    app.add_option("--api-key-file", api_key_file_,
                   "file holding the HTTP API's key: requests without `Authorization: Bearer "
                   "<key>` get 401");
    app.add_option("--http-max-connections", o_.http_max_connections,
                   "open connections to the HTTP API (a quarter from one address); idle ones are "
                   "closed to make room")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--http-max-body-bytes", o_.http_max_body_bytes,
                   "largest HTTP API request body; larger ones get 413")
        ->check(CLI::Range(uint64_t{1024}, uint64_t{1} << 30));
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
    app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o_.enable_prefix_caching,
                   "reuse the KV blocks and state of shared prompt prefixes (on by default)");
    app.add_option("--prefix-cache-max-blocks", o_.prefix_cache_max_blocks,
                   "blocks the prefix cache may keep, each with a state snapshot on every worker "
                   "(0 = min(kv-blocks, 4 x max-num-seqs))")
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
        ->check(FiniteRange(0.0, 3600.0));
    app.add_option("--served-model-name", o_.served_model_name,
                   "the model's name in GetModelInfo (default: the model directory's name)");
    app.add_option("--tls-cert", o_.tls.cert, "PEM certificate chain: serve gRPC (and metrics) over TLS");
    app.add_option("--tls-key", o_.tls.key, "PEM private key of --tls-cert");
    app.add_option("--tls-client-ca", o_.tls.client_ca,
                   "PEM CA bundle: require client certificates it signed (mutual TLS)");
    app.add_flag("--metrics-plaintext", o_.metrics_plaintext,
                 "serve /metrics without TLS even when --tls-cert is set");
    app.add_option("--max-requests-per-client", o_.admission.max_requests_per_client,
                   "requests one client (IP address, or TLS identity) may have in flight; more get "
                   "RESOURCE_EXHAUSTED (0 = half of --max-num-seqs + --max-waiting, at least --max-num-seqs)")
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("--max-concurrent-streams", o_.max_concurrent_streams,
                   "gRPC streams per connection (HTTP/2 SETTINGS); further calls wait on the client")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--tensor-parallel-size", tp_.world_size,
                   "ranks the model is split over (attention heads and routed experts; "
                   "architecture.md §2): 1 runs in this process, N > 1 on N worker processes")
        ->check(CLI::Range(1, 4096));
    app.add_flag("--external-workers", external_workers_,
                 "wait for N `dsv4-node worker` ranks to register instead of spawning them");
    app.add_option("--worker-listen", tp_.listen,
                   "control-plane address HOST:PORT the worker ranks dial (default: loopback, any port)");
    app.add_option("--data-plane", tp_.data_plane,
                   "collectives of a tensor-parallel node: auto (NCCL when every rank has a GPU of "
                   "its own, else Gloo)|gloo|nccl")
        ->check(CLI::IsMember({"auto", "gloo", "nccl"}));
    app.add_option("--worker-secret-file", worker_secret_file_,
                   "shared secret the worker ranks must present (required with --external-workers; "
                   "spawned ranks get a random one)");
    app.add_option("--metrics-max-connections", o_.metrics_max_connections,
                   "open connections to the metrics listener (64 from one address); more are "
                   "closed at once")
        ->check(CLI::Range(1, 1 << 20));
  }

  int Run() override {
    // Before anything loads: a signal now exits at once, later it drains.
    ShutdownSignals signals;
    if (flags_.synthetic_config.empty()) {
      auto dir = flags_.ResolveModelDir();
      if (!dir.ok()) return Fail(dir.status());
      o_.model_dir = *dir;
    } else if (o_.tokenizer_path.empty()) {
      return Fail(absl::InvalidArgumentError("--synthetic-config needs --tokenizer"));
    }
    if (!port_file_.empty()) {
      // Writable before minutes of loading, not after.
      if (absl::Status s = WritePortFile(-1, -1, -1); !s.ok()) return Fail(s);
    }
    o_.synthetic_config = flags_.synthetic_config;
    o_.seed = flags_.seed;
    o_.device = flags_.device;
    o_.precision = flags_.precision;
    o_.weight_format = flags_.weight_format;
    o_.threads = flags_.threads;
    o_.block_size = flags_.block_size;
    o_.force_indexer_scoring = flags_.force_indexer_scoring;
    o_.batch_invariant = flags_.batch_invariant;
    if (absl::Status s = UseWorkerGroup(); !s.ok()) return Fail(s);
    if (!api_key_file_.empty()) {
      if (o_.http_listen.empty()) {
        return Fail(absl::InvalidArgumentError("--api-key-file needs --http-listen"));
      }
      auto key = control::ReadSecretFile(api_key_file_, "--api-key-file");
      if (!key.ok()) return Fail(key.status());
      o_.api_key = *key;
    }
    o_.repetition_mode = repetition_action_ == "stop"   ? RepetitionMode::kStop
                         : repetition_action_ == "off" ? RepetitionMode::kOff
                                                       : RepetitionMode::kObserve;
    auto node = ServingNode::Start(o_);
    if (!node.ok()) return Fail(node.status());
    if (!port_file_.empty()) {
      if (absl::Status s = WritePortFile((*node)->grpc_port(), (*node)->metrics_port(),
                                         (*node)->http_port());
          !s.ok()) {
        (*node)->Shutdown();
        return Fail(s);
      }
    }
    ServingNode* n = node->get();
    signals.Serving([n] { n->CancelAll("cancelled: forced shutdown (SIGINT during the drain)"); });
    const int sig = signals.WaitForDrain();
    LogInfo("draining", {{"signal", sig}, {"timeout_seconds", drain_timeout_s_}});
    const bool drained =
        n->Drain(std::chrono::milliseconds(static_cast<int64_t>(drain_timeout_s_ * 1000)));
    n->Shutdown();
    signals.Serving(nullptr);  // the node goes away before the handlers do
    const bool forced = signals.forced();
    LogInfo("stopped", {{"drained", drained && !forced}, {"forced", forced}});
    return forced ? 130 : 0;
  }

 private:
  // Writes {"grpc": G, "metrics": M, "http": H} to --port-file atomically (a temporary file
  // renamed); with negative ports it only checks that the file can be written.
  absl::Status WritePortFile(int grpc, int metrics, int http) const {
    const std::string tmp = port_file_ + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--port-file: cannot write ", tmp, ": ", std::strerror(errno)));
    }
    const std::string text = absl::StrCat("{\"grpc\": ", grpc, ", \"metrics\": ", metrics,
                                          ", \"http\": ", http, "}\n");
    const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    const bool closed = ::close(fd) == 0;
    if (grpc < 0) {
      ::unlink(tmp.c_str());
      return absl::OkStatus();
    }
    if (!wrote || !closed || std::rename(tmp.c_str(), port_file_.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("--port-file: cannot write ", port_file_, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  // --tensor-parallel-size N > 1: the engine's worker is a group of N worker processes.
  absl::Status UseWorkerGroup() {
    if (tp_.world_size == 1) {
      if (external_workers_ || !worker_secret_file_.empty()) {
        return absl::InvalidArgumentError(
            "--external-workers and --worker-secret-file need --tensor-parallel-size > 1");
      }
      return absl::OkStatus();
    }
    tp_.spawn = !external_workers_;
    if (!worker_secret_file_.empty()) {
      ASSIGN_OR_RETURN(tp_.secret, control::ReadSecretFile(worker_secret_file_, "--worker-secret-file"));
    } else if (external_workers_) {
      return absl::InvalidArgumentError("--external-workers needs --worker-secret-file");
    } else {
      ASSIGN_OR_RETURN(tp_.secret, NewRendezvousToken());
    }
    RemoteGroupOptions group = tp_;
    o_.worker_factory = [group](const std::string& device) -> absl::StatusOr<std::unique_ptr<Worker>> {
      RemoteGroupOptions g = group;
      g.device = device;
      ASSIGN_OR_RETURN(auto w, RemoteWorkerGroup::Start(g));
      return std::unique_ptr<Worker>(std::move(w));
    };
    return absl::OkStatus();
  }

  ModelFlags flags_;
  NodeOptions o_;
  RemoteGroupOptions tp_;  // world_size 1: the in-process worker
  bool external_workers_ = false;
  std::string worker_secret_file_;
  std::string api_key_file_;
  std::string port_file_;
  std::string repetition_action_ = "observe";
  double drain_timeout_s_ = 30;
};

}  // namespace

std::unique_ptr<Command> AddServe(CLI::App& app, WorkerFactory workers) {
  return std::make_unique<Serve>(app, std::move(workers));
}

std::vector<CommandSpec> CoordinatorCommands(WorkerFactory workers) {
  return {
      {"serve", "run the serving node (gRPC, Prometheus, the OpenAI-compatible HTTP API)",
       [workers](CLI::App& app) { return AddServe(app, workers); }},
      {"client", "stream one generation from a running node", AddClient},
      {"loadgen", "closed-loop load against a running node", AddLoadgen},
  };
}

}  // namespace dsv4::cli
