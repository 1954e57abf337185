// A serving node whose "model" plays scripts: for the end-to-end tests of the OpenAI API
// (tests/e2e/openai_test.sh), which need generations that the tiny random model never makes
// (tool calls in the DSML format). The real coordinator (ServingNode: engine, scheduler, output
// processing, the gRPC and HTTP APIs) runs unchanged; only its worker is fake. A prompt whose
// text contains `[[script:NAME]]` (the last one counts) gets exactly the tokens of
// scripts.json[NAME] (tokenized with the node's tokenizer, so `</think>` is the special token),
// then end-of-sequence; any other prompt gets a repeated filler token.
//   dsv4_scripted_node --scripts FILE [--http-listen H:P] [--listen H:P] [--metrics-listen H:P]
//                      [--port-file F] [--api-key-file F] [...]   SIGTERM drains and exits 0.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "control/secret.h"
#include "node/serving_node.h"
#include "node/tokenizer/tokenizer.h"

namespace dsv4 {
namespace {

class ScriptedWorker final : public Worker {
 public:
  ScriptedWorker(const Tokenizer* tok, std::map<std::string, std::vector<int32_t>> scripts)
      : tok_(tok), scripts_(std::move(scripts)) {}
  WorkerInfo info() const override {
    WorkerInfo i;
    i.device = "scripted";
    i.num_blocks = cache_.num_blocks;
    i.num_slots = cache_.num_slots;
    i.block_size = cache_.block_size;
    i.max_model_len = cache_.max_model_len;
    return i;
  }
  absl::Status Configure(const WorkerConfig& c) override {
    cache_ = c.cache;
    return absl::OkStatus();
  }
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    for (uint64_t id : plan.released) seqs_.erase(id);
    StepResult r;
    r.step_id = plan.step_id;
    for (const ScheduledSeq& s : plan.seqs) {
      Seq& q = seqs_[s.request_id];
      if (s.start_pos == 0) q = Seq{};
      if (s.start_pos < s.prompt_len) {
        q.prompt.insert(q.prompt.end(), s.tokens.begin(), s.tokens.end());
      }
      if (!s.sample) continue;
      if (s.output_index == 0) q.script = Pick(q.prompt);
      SampledToken t;
      t.request_id = s.request_id;
      t.token = s.output_index < static_cast<int32_t>(q.script.size()) ? q.script[s.output_index]
                                                                        : kEos;
      if (q.script.empty()) t.token = kFiller;
      if (s.sampling && s.sampling->logprobs > 0) {
        t.logprob = -0.5f;
        for (int k = 0; k < s.sampling->logprobs; ++k) t.top.emplace_back(t.token + k, -0.5f - k);
      }
      r.sampled.push_back(t);
    }
    return r;
  }

 private:
  static constexpr int32_t kEos = 1;
  static constexpr int32_t kFiller = 300;
  struct Seq {
    std::vector<int32_t> prompt;
    std::vector<int32_t> script;
  };
  std::vector<int32_t> Pick(const std::vector<int32_t>& prompt) const {
    const std::string text = tok_->Decode(prompt);
    const size_t at = text.rfind("[[script:");
    if (at == std::string::npos) return {};
    const size_t end = text.find("]]", at);
    if (end == std::string::npos) return {};
    auto it = scripts_.find(text.substr(at + 9, end - at - 9));
    return it == scripts_.end() ? std::vector<int32_t>{} : it->second;
  }
  const Tokenizer* tok_;
  std::map<std::string, std::vector<int32_t>> scripts_;
  CacheConfig cache_;
  std::map<uint64_t, Seq> seqs_;
};

int Main(int argc, char** argv) {
  NodeOptions o;
  std::string scripts_path, port_file, api_key_file, log_level;
  int64_t max_model_len = 1024;
  CLI::App app("scripted serving node for the OpenAI API tests");
  app.allow_extras();
  app.add_option("--scripts", scripts_path)->required();
  app.add_option("--listen", o.listen);
  app.add_option("--metrics-listen", o.metrics_listen);
  app.add_option("--http-listen", o.http_listen);
  app.add_option("--port-file", port_file);
  app.add_option("--api-key-file", api_key_file);
  app.add_option("--max-model-len", max_model_len);
  app.add_option("--log-level", log_level);
  CLI11_PARSE(app, argc, argv);
  // Signals go to sigwait below: blocked before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  o.model_dir = DSV4_TEST_DATA_DIR "/dsv4-tiny";
  o.tokenizer_path = DSV4_TEST_DATA_DIR "/tok-tiny/tokenizer.json";
  o.max_model_len = max_model_len;
  if (!api_key_file.empty()) {
    auto key = control::ReadSecretFile(api_key_file, "--api-key-file");
    if (!key.ok()) return std::fprintf(stderr, "%s\n", std::string(key.status().message()).c_str()), 2;
    o.api_key = *key;
  }
  auto tok = Tokenizer::Load(o.tokenizer_path);
  if (!tok.ok()) return std::fprintf(stderr, "tokenizer: %s\n", std::string(tok.status().message()).c_str()), 2;
  std::ifstream in(scripts_path);
  std::stringstream text;
  text << in.rdbuf();
  const auto json = nlohmann::json::parse(text.str(), nullptr, false);
  if (!json.is_object()) return std::fprintf(stderr, "--scripts: not a JSON object\n"), 2;
  std::map<std::string, std::vector<int32_t>> scripts;
  for (const auto& [name, value] : json.items()) {
    auto ids = (*tok)->Encode(value.get<std::string>());
    if (!ids.ok()) return std::fprintf(stderr, "script %s: %s\n", name.c_str(), std::string(ids.status().message()).c_str()), 2;
    scripts[name] = *ids;
  }
  const Tokenizer* t = tok->get();
  o.worker_factory = [t, scripts](const std::string&) -> absl::StatusOr<std::unique_ptr<Worker>> {
    return std::unique_ptr<Worker>(std::make_unique<ScriptedWorker>(t, scripts));
  };
  auto node = ServingNode::Start(o);
  if (!node.ok()) return std::fprintf(stderr, "%s\n", std::string(node.status().message()).c_str()), 1;
  if (!port_file.empty()) {
    std::ofstream(port_file + ".tmp") << absl::StrCat("{\"grpc\": ", (*node)->grpc_port(),
                                                      ", \"metrics\": ", (*node)->metrics_port(),
                                                      ", \"http\": ", (*node)->http_port(), "}\n");
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  int sig = 0;
  sigwait(&set, &sig);
  (*node)->Drain(std::chrono::seconds(5));
  (*node)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::Main(argc, argv); }
