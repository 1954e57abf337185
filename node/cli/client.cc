// dsv4-node client: streams one generation from a running node and prints it (text, or one JSON
// object per response with --json). Exit code 0 when the request finished, 1 otherwise.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "dsv4/v1/dsv4.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "common/flag_checks.h"
#include "common/json_util.h"
#include "common/status.h"
#include "node/cli/commands.h"

namespace dsv4::cli {
namespace {

class Client final : public Command {
 public:
  explicit Client(CLI::App& app) {
    app.add_option("--target", target_, "node address HOST:PORT");
    app.add_option("--prompt", prompt_, "raw text prompt");
    app.add_option("--prompt-ids", prompt_ids_, "prompt token ids, comma separated");
    app.add_option("--chat", chat_, "a user message, rendered with the DeepSeek-V4 chat format");
    app.add_option("--system", system_, "system message for --chat");
    app.add_flag("--thinking,!--no-thinking", thinking_, "chat with <think> on (default) or off");
    app.add_option("--max-tokens", max_tokens_, "tokens to generate (0 = node default)")
        ->check(CLI::Range(0, 1 << 30));
    app.add_option("--temperature", temperature_, "0 = greedy");
    app.add_option("--top-p", top_p_, "nucleus mass");
    app.add_option("--top-k", top_k_, "top-k");
    app.add_option("--seed", seed_, "sampling seed");
    app.add_option("--stop", stop_, "stop string (repeatable)");
    app.add_option("--stop-token-id", stop_token_ids_, "stop token id (repeatable)");
    app.add_flag("--ignore-eos", ignore_eos_, "keep generating after end-of-sequence");
    app.add_option("--logprobs", logprobs_, "top-n logprobs per token");
    app.add_option("--request-id", request_id_, "request id");
    app.add_option("--timeout", timeout_s_, "deadline in seconds")->check(FiniteRange(0.001, 1e6));
    app.add_option("--wait-ready", wait_ready_s_,
                   "first wait up to this many seconds for the node to report SERVING")
        ->check(FiniteRange(0.0, 3600.0));
    app.add_flag("--json", json_, "print every response as a JSON line");
    app.add_option("--tls-ca", tls_ca_, "PEM CA bundle: connect over TLS, verifying the node");
    app.add_option("--tls-cert", tls_cert_, "PEM client certificate (mutual TLS; needs --tls-ca)");
    app.add_option("--tls-key", tls_key_, "PEM key of --tls-cert");
  }

  int Run() override {
    grpc::ChannelArguments args;
    // Reconnect quickly while waiting for a node that is still starting.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto creds = Credentials();
    if (!creds.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(creds.status().message()).c_str());
      return 2;
    }
    auto channel = grpc::CreateCustomChannel(target_, *creds, args);
    if (wait_ready_s_ > 0 && !WaitReady(channel)) {
      std::fprintf(stderr, "error: %s did not become ready within %.0f s\n", target_.c_str(),
                   wait_ready_s_);
      return 1;
    }
    v1::GenerateRequest req;
    req.set_request_id(request_id_);
    const int inputs = !prompt_.empty() + !prompt_ids_.empty() + !chat_.empty();
    if (inputs != 1) {
      std::fprintf(stderr, "error: give exactly one of --prompt, --prompt-ids, --chat\n");
      return 2;
    }
    if (!prompt_.empty()) req.set_text(prompt_);
    if (!prompt_ids_.empty()) {
      for (absl::string_view p : absl::StrSplit(prompt_ids_, absl::ByAnyChar(", "), absl::SkipEmpty())) {
        int32_t id;
        if (!absl::SimpleAtoi(p, &id)) {
          std::fprintf(stderr, "error: --prompt-ids: \"%s\" is not an integer\n", std::string(p).c_str());
          return 2;
        }
        req.mutable_token_ids()->add_ids(id);
      }
    }
    if (!chat_.empty()) {
      auto* chat = req.mutable_chat();
      if (!system_.empty()) {
        auto* m = chat->add_messages();
        m->set_role("system");
        m->set_content(system_);
      }
      auto* m = chat->add_messages();
      m->set_role("user");
      m->set_content(chat_);
      chat->set_thinking(thinking_);
    }
    if (max_tokens_ > 0) req.set_max_tokens(max_tokens_);
    if (temperature_ >= 0) req.mutable_sampling()->set_temperature(temperature_);
    if (top_p_ > 0) req.mutable_sampling()->set_top_p(top_p_);
    req.mutable_sampling()->set_top_k(top_k_);
    if (seed_ >= 0) req.mutable_sampling()->set_seed(static_cast<uint64_t>(seed_));
    for (const auto& s : stop_) req.add_stop(s);
    for (int32_t id : stop_token_ids_) req.add_stop_token_ids(id);
    req.set_ignore_eos(ignore_eos_);
    req.set_logprobs(logprobs_);

    auto stub = v1::Dsv4::NewStub(channel);
    grpc::ClientContext ctx;
    if (timeout_s_ > 0) {
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000)));
    }
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    v1::Channel channel_now = v1::CHANNEL_UNSPECIFIED;
    bool finished = false;
    while (reader->Read(&resp)) {
      if (json_) {
        std::string line;
        google::protobuf::util::JsonPrintOptions opts;
        opts.preserve_proto_field_names = true;
        (void)google::protobuf::util::MessageToJsonString(resp, &line, opts);
        std::cout << line << "\n" << std::flush;
      } else if (resp.has_chunk()) {
        const auto& c = resp.chunk();
        if (c.channel() != channel_now && !c.text().empty()) {
          std::cout << (channel_now == v1::CHANNEL_UNSPECIFIED ? "" : "\n")
                    << (c.channel() == v1::CHANNEL_REASONING ? "[reasoning] " : "[answer] ");
          channel_now = c.channel();
        }
        std::cout << c.text() << std::flush;
      } else if (resp.has_finished()) {
        const auto& f = resp.finished();
        std::cout << "\n";
        std::fprintf(stderr, "[%s] finish_reason=%s phase=%s prompt=%d completion=%d reasoning=%d "
                     "ttft=%.3fs e2e=%.3fs\n",
                     resp.request_id().c_str(), v1::FinishReason_Name(f.finish_reason()).c_str(),
                     v1::Phase_Name(f.phase_at_finish()).c_str(), f.usage().prompt_tokens(),
                     f.usage().completion_tokens(), f.usage().reasoning_tokens(),
                     f.timings().time_to_first_token_seconds(), f.timings().e2e_seconds());
      } else if (resp.has_error()) {
        std::fprintf(stderr, "\nerror: %s\n", resp.error().message().c_str());
      }
      finished |= resp.has_finished();
    }
    const grpc::Status st = reader->Finish();
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", StatusName(st.error_code()), st.error_message().c_str());
      return 1;
    }
    return finished ? 0 : 1;
  }

 private:
  // Plaintext, or TLS with --tls-ca (and a client certificate with --tls-cert/--tls-key).
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials() const {
    if (tls_ca_.empty()) {
      if (!tls_cert_.empty() || !tls_key_.empty()) {
        return absl::InvalidArgumentError("--tls-cert and --tls-key need --tls-ca");
      }
      return grpc::InsecureChannelCredentials();
    }
    if (tls_cert_.empty() != tls_key_.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key: give both or neither");
    }
    grpc::SslCredentialsOptions ssl;
    auto read = [](const char* flag, const std::string& path, std::string* out) -> absl::Status {
      auto pem = ReadFileToString(path, 1 << 20);
      if (!pem.ok()) return Annotate(pem.status(), flag);
      *out = *std::move(pem);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(read("--tls-ca", tls_ca_, &ssl.pem_root_certs));
    if (!tls_cert_.empty()) {
      RETURN_IF_ERROR(read("--tls-cert", tls_cert_, &ssl.pem_cert_chain));
      RETURN_IF_ERROR(read("--tls-key", tls_key_, &ssl.pem_private_key));
    }
    return grpc::SslCredentials(ssl);
  }

  std::string tls_ca_, tls_cert_, tls_key_;
  static const char* StatusName(grpc::StatusCode c) {
    switch (c) {
      case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
      case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
      case grpc::UNAVAILABLE: return "UNAVAILABLE";
      case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
      case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
      case grpc::CANCELLED: return "CANCELLED";
      case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
      default: return "ERROR";
    }
  }

  bool WaitReady(const std::shared_ptr<grpc::Channel>& channel) {
    auto health = grpc::health::v1::Health::NewStub(channel);
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(wait_ready_s_ * 1000));
    while (std::chrono::steady_clock::now() < until) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      if (health->Check(&ctx, req, &resp).ok() &&
          resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  std::string target_ = "127.0.0.1:50051";
  std::string prompt_, prompt_ids_, chat_, system_, request_id_;
  bool thinking_ = true;
  int max_tokens_ = 0;
  float temperature_ = -1, top_p_ = 0;
  int top_k_ = 0;
  int64_t seed_ = -1;
  std::vector<std::string> stop_;
  std::vector<int32_t> stop_token_ids_;
  bool ignore_eos_ = false;
  int logprobs_ = 0;
  double timeout_s_ = 0;
  double wait_ready_s_ = 0;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> AddClient(CLI::App& app) { return std::make_unique<Client>(app); }

}  // namespace dsv4::cli
