// dsv4-node loadgen: a closed-loop load generator against a running node. For each concurrency
// level, N client threads each keep one stream open at a time until the level's request count is
// done; reports requests/s, generated tokens/s, and TTFT / ITL percentiles measured on the client
// side. The stream is a gRPC Generate call, or with --http a streamed POST /v1/completions of the
// OpenAI-compatible API with the same token-id prompt (one server-sent event per engine chunk),
// so that both APIs are measured on the same node and load.
//
// Prefix caching (--shared-prefix-len, --turns): every prompt starts with the same N tokens (a
// system prompt or document), and a client's conversation carries --turns turns, each prompt the
// previous prompt + its answer + --prompt-len new tokens. Each level first runs one request alone
// on a prefix no request has used (ttft_cold: the prefix prefilled), then the level; cached% is the
// share of prompt tokens the node reported from its cache (Usage.cached_prompt_tokens).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "dsv4/v1/dsv4.grpc.pb.h"
#include "control/secret.h"
#include "node/cli/commands.h"
#include "node/http/sse_client.h"

namespace dsv4::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

class Loadgen final : public Command {
 public:
  explicit Loadgen(CLI::App& app) {
    app.add_option("--target", target_, "node address HOST:PORT");
    app.add_option("--concurrency", levels_, "concurrency levels")->delimiter(',');
    app.add_option("--requests", requests_, "requests per level (0 = 4 x concurrency, >= 16)")
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("--prompt-len", prompt_len_,
                   "prompt tokens (after the shared prefix; 0 with one: identical prompts)")
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("--shared-prefix-len", shared_prefix_len_,
                   "tokens every prompt starts with (a new prefix for each level)")
        ->check(CLI::Range(0, 1 << 22));
    app.add_option("--turns", turns_,
                   "turns per conversation: each prompt extends the previous prompt and answer")
        ->check(CLI::Range(1, 1 << 10));
    app.add_option("--max-tokens", max_tokens_, "tokens per request")->check(CLI::Range(1, 1 << 20));
    app.add_option("--vocab", vocab_, "token ids are drawn from [9, vocab)")->check(CLI::Range(10, 1 << 24));
    app.add_option("--api-key-file", api_key_file_,
                   "with --http: the file holding the node's API key (sent as a Bearer token)");
    app.add_option("--http", http_,
                   "HOST:PORT of the OpenAI-compatible API: stream POST /v1/completions instead of "
                   "gRPC Generate");
  }

  int Run() override {
    if (prompt_len_ == 0 && shared_prefix_len_ == 0) {
      std::fprintf(stderr, "error: --prompt-len 0 needs a --shared-prefix-len\n");
      return 2;
    }
    auto channel = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
    if (!http_.empty()) {
      const size_t colon = http_.rfind(':');
      if (colon == std::string::npos) {
        std::fprintf(stderr, "error: --http must be HOST:PORT\n");
        return 2;
      }
      http_host_ = http_.substr(0, colon);
      http_port_ = std::atoi(http_.c_str() + colon + 1);
      if (!api_key_file_.empty()) {
        auto key = control::ReadSecretFile(api_key_file_, "--api-key-file");
        if (!key.ok()) {
          std::fprintf(stderr, "error: %s\n", std::string(key.status().message()).c_str());
          return 2;
        }
        api_key_ = *key;
      }
      auto models = http::SseClient(http_host_, http_port_, api_key_).Get("/v1/models");
      const auto j = nlohmann::json::parse(models.ok() ? *models : "", nullptr, false);
      if (!models.ok() || !j.is_object() || !j.contains("data") || j["data"].empty()) {
        std::fprintf(stderr, "error: GET /v1/models on %s failed: %s\n", http_.c_str(),
                     models.ok() ? "no model" : std::string(models.status().message()).c_str());
        return 1;
      }
      model_ = j["data"][0].value("id", "");
    }
    std::printf("target=%s api=%s prompt_len=%d shared_prefix_len=%d turns=%d max_tokens=%d "
                "(ignore_eos, greedy)\n",
                http_.empty() ? target_.c_str() : http_.c_str(), http_.empty() ? "grpc" : "http",
                prompt_len_, shared_prefix_len_, turns_, max_tokens_);
    std::printf("%5s %6s %10s %10s %10s %10s %10s %10s %7s %8s %10s\n", "conc", "reqs", "req/s",
                "tok/s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "errors", "cached%",
                "ttft_cold");
    for (int conc : levels_) {
      if (conc < 1 || conc > 1024) {
        std::fprintf(stderr, "error: --concurrency levels must be in [1, 1024]\n");
        return 2;
      }
      const int total = requests_ > 0 ? requests_ : std::max(16, 4 * conc);
      std::atomic<int> next{0}, errors{0};
      std::string first_error;
      std::atomic<int64_t> tokens{0}, prompt_tokens{0}, cached_tokens{0};
      std::mutex mu;
      std::vector<double> ttft, itl;
      // A prefix of this level's own, first prefilled by one request alone.
      std::vector<int32_t> prefix;
      std::mt19937 prefix_rng(7 + conc);
      for (int i = 0; i < shared_prefix_len_; ++i) prefix.push_back(RandomToken(prefix_rng));
      double ttft_cold = 0;
      if (!prefix.empty()) {
        auto stub = v1::Dsv4::NewStub(channel);
        http::SseClient sse(http_host_, http_port_, api_key_);
        std::mt19937 rng(99 + conc);
        const Turn cold = Stream(*stub, sse, Prompt(prefix, {}, rng));
        if (!cold.ok) std::printf("  cold request failed: %s\n", cold.why.c_str());
        ttft_cold = cold.ttft;
      }
      const auto t0 = Clock::now();
      std::vector<std::thread> threads;
      for (int w = 0; w < conc; ++w) {
        threads.emplace_back([&, w] {
          auto stub = v1::Dsv4::NewStub(channel);
          std::mt19937 rng(1000 + w);
          std::vector<double> my_ttft, my_itl;
          http::SseClient sse(http_host_, http_port_, api_key_);
          std::vector<int32_t> history;  // this conversation's last prompt and answer
          for (int turn = 0; next.fetch_add(1) < total; turn = (turn + 1) % turns_) {
            const std::vector<int32_t> prompt = Prompt(prefix, turn == 0 ? std::vector<int32_t>{} : history, rng);
            const Turn t = Stream(*stub, sse, prompt);
            if (t.ok) {
              my_ttft.push_back(t.ttft);
              my_itl.insert(my_itl.end(), t.itl.begin(), t.itl.end());
              tokens += static_cast<int64_t>(t.output.size());
              prompt_tokens += static_cast<int64_t>(prompt.size());
              cached_tokens += t.cached;
            } else if (errors.fetch_add(1) == 0) {
              std::lock_guard<std::mutex> lock(mu);
              first_error = t.why;
            }
            history = prompt;
            history.insert(history.end(), t.output.begin(), t.output.end());
          }
          std::lock_guard<std::mutex> lock(mu);
          ttft.insert(ttft.end(), my_ttft.begin(), my_ttft.end());
          itl.insert(itl.end(), my_itl.begin(), my_itl.end());
        });
      }
      for (auto& t : threads) t.join();
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const double cached_share =
          prompt_tokens.load() > 0 ? 100.0 * cached_tokens.load() / prompt_tokens.load() : 0;
      std::printf("%5d %6d %10.2f %10.1f %9.1fms %9.1fms %9.2fms %9.2fms %7d %7.1f%% %9.1fms\n",
                  conc, total, total / secs, tokens.load() / secs, 1e3 * Percentile(ttft, 0.5),
                  1e3 * Percentile(ttft, 0.99), 1e3 * Percentile(itl, 0.5),
                  1e3 * Percentile(itl, 0.99), errors.load(), cached_share, 1e3 * ttft_cold);
      if (!first_error.empty()) std::printf("  first error: %s\n", first_error.c_str());
      std::fflush(stdout);
    }
    return 0;
  }

 private:
  // One request's stream as the client saw it.
  struct Turn {
    bool ok = false;
    std::string why;
    double ttft = 0;
    std::vector<double> itl;
    std::vector<int32_t> output;
    int64_t cached = 0;  // prompt tokens the node served from its prefix cache
  };

  int32_t RandomToken(std::mt19937& rng) const {
    return 9 + static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab_ - 9));
  }

  // A turn's prompt: the shared prefix (or the conversation so far), then --prompt-len new tokens.
  std::vector<int32_t> Prompt(const std::vector<int32_t>& prefix, const std::vector<int32_t>& history,
                              std::mt19937& rng) const {
    std::vector<int32_t> p = history.empty() ? prefix : history;
    for (int i = 0; i < prompt_len_; ++i) p.push_back(RandomToken(rng));
    return p;
  }

  Turn Stream(v1::Dsv4::Stub& stub, http::SseClient& sse, const std::vector<int32_t>& prompt) const {
    return http_.empty() ? GrpcStream(stub, prompt) : HttpStream(sse, prompt);
  }

  // Records a chunk of `n` tokens arriving now.
  static void Arrived(Turn* t, Clock::time_point start, Clock::time_point* last, bool* first) {
    const auto now = Clock::now();
    if (*first) {
      t->ttft = std::chrono::duration<double>(now - start).count();
    } else {
      t->itl.push_back(std::chrono::duration<double>(now - *last).count());
    }
    *first = false;
    *last = now;
  }

  // One gRPC Generate stream.
  Turn GrpcStream(v1::Dsv4::Stub& stub, const std::vector<int32_t>& prompt) const {
    v1::GenerateRequest req;
    for (int32_t id : prompt) req.mutable_token_ids()->add_ids(id);
    req.set_max_tokens(max_tokens_);
    req.set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    Turn t;
    const auto start = Clock::now();
    auto last = start;
    bool first = true;
    auto reader = stub.Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      if (resp.has_finished()) t.cached = resp.finished().usage().cached_prompt_tokens();
      if (!resp.has_chunk() || resp.chunk().token_ids_size() == 0) continue;
      Arrived(&t, start, &last, &first);
      t.output.insert(t.output.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
    }
    const grpc::Status status = reader->Finish();
    t.ok = status.ok();
    if (!status.ok()) t.why = status.error_message();
    return t;
  }

  // One streamed POST /v1/completions. return_token_ids makes an event of every engine chunk, so
  // tokens are timed as on gRPC even when their text is held back.
  Turn HttpStream(http::SseClient& sse, const std::vector<int32_t>& prompt) const {
    nlohmann::json body = {{"model", model_}, {"prompt", prompt}, {"max_tokens", max_tokens_},
                           {"ignore_eos", true}, {"temperature", 0}, {"stream", true},
                           {"return_token_ids", true},
                           {"stream_options", {{"include_usage", true}}}};
    Turn t;
    const auto start = Clock::now();
    auto last = start;
    bool first = true, failed = false;
    absl::Status s = sse.Post("/v1/completions", body.dump(), [&](std::string_view data) {
      if (data == "[DONE]") return;
      const auto e = nlohmann::json::parse(data, nullptr, false);
      if (!e.is_object() || e.contains("error")) {
        failed = true;
        t.why = std::string(data.substr(0, 300));
        return;
      }
      if (e.contains("usage") && e["usage"].is_object()) {
        const auto& details = e["usage"].value("prompt_tokens_details", nlohmann::json::object());
        if (details.is_object()) t.cached = details.value("cached_tokens", 0);
        return;
      }
      if (!e.contains("choices") || e["choices"].empty() || !e["choices"][0].contains("token_ids") ||
          !e["choices"][0]["token_ids"].is_array() || e["choices"][0]["token_ids"].empty()) {
        return;
      }
      Arrived(&t, start, &last, &first);
      for (const auto& id : e["choices"][0]["token_ids"]) {
        if (id.is_number_integer()) t.output.push_back(id.get<int32_t>());
      }
    });
    if (!s.ok()) t.why = std::string(s.message());
    t.ok = s.ok() && !failed;
    return t;
  }

  std::string target_ = "127.0.0.1:50051";
  std::vector<int> levels_ = {1, 8, 32, 64};
  int requests_ = 0;
  int prompt_len_ = 64;
  int max_tokens_ = 64;
  int shared_prefix_len_ = 0;
  int turns_ = 1;
  int vocab_ = 1024;
  std::string http_;  // "" = gRPC
  std::string api_key_file_, api_key_;
  std::string http_host_;
  int http_port_ = 0;
  std::string model_;
};

}  // namespace

std::unique_ptr<Command> AddLoadgen(CLI::App& app) { return std::make_unique<Loadgen>(app); }

}  // namespace dsv4::cli
