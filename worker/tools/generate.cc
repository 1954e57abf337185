// dsv4-node generate: prompt token ids in, generated token ids out (greedy or sampled).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "kernels/sampling_ref.h"
#include "common/cli_command.h"
#include "common/flag_checks.h"
#include "worker/tools/model_loader.h"
#include "worker/tools/model_tools.h"
#include "worker/model/local_sequences.h"

namespace dsv4::cli {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: \"", piece, "\" is not an integer token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt-ids: no token ids");
  return ids;
}

class Generate final : public Command {
 public:
  explicit Generate(CLI::App& app) {
    flags_.Register(app);
    app.add_option("--prompt-ids", prompt_, "prompt token ids, comma or space separated")
        ->required();
    app.add_option("--max-tokens", max_tokens_, "tokens to generate")->check(CLI::Range(1, 1 << 20));
    app.add_option("--temperature", sampling_.temperature, "0 = greedy")
        ->check(FiniteRange(0.0, 100.0));
    app.add_option("--top-k", sampling_.top_k, "0 = off")->check(CLI::Range(0, 1 << 24));
    app.add_option("--top-p", sampling_.top_p, "nucleus mass in (0, 1]")
        ->check(FiniteRange(1e-6, 1.0));
    app.add_option("--min-p", sampling_.min_p, "minimum probability relative to the top token")
        ->check(FiniteRange(0.0, 1.0));
    app.add_option("--seed", sampling_.seed, "sampling seed");
    app.add_flag("--ignore-eos", ignore_eos_, "keep generating after an end-of-sequence token");
  }

  int Run() override {
    auto ids = ParseIds(prompt_);
    if (!ids.ok()) return Fail(ids.status());
    ModelLoader loader(flags_);
    auto model = loader.Load(/*slots=*/1, static_cast<int64_t>(ids->size()) + max_tokens_);
    if (!model.ok()) return Fail(model.status());
    const ModelConfig& config = (*model)->config();
    LocalSequences seqs(**model);
    auto seq = seqs.Create();
    if (!seq.ok()) return Fail(seq.status());
    StepOptions options;
    options.force_indexer_scoring = flags_.force_indexer_scoring;
    std::vector<int32_t> out;
    std::vector<int32_t> next = *ids;
    for (int i = 0; i < max_tokens_; ++i) {
      auto step = seqs.Next(*seq, next, SequenceStep::Logits::kLast);
      if (!step.ok()) return Fail(step.status());
      StepLogits logits;
      if (absl::Status s = (*model)->Step({&*step, 1}, options, &logits); !s.ok()) return Fail(s);
      seqs.Advance(*seq, static_cast<int64_t>(next.size()));
      const int32_t token = SampleRef(logits.Row(0), sampling_, static_cast<uint64_t>(i));
      out.push_back(token);
      std::printf("%d%s", token, i + 1 < max_tokens_ ? " " : "");
      std::fflush(stdout);
      const bool eos = std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(),
                                 token) != config.eos_token_ids.end();
      if (eos && !ignore_eos_) break;
      next.assign(1, token);
    }
    std::printf("\n");
    return 0;
  }

 private:
  ModelFlags flags_;
  std::string prompt_;
  int max_tokens_ = 16;
  SamplingParams sampling_;
  bool ignore_eos_ = false;
};

}  // namespace

std::unique_ptr<Command> AddGenerate(CLI::App& app) { return std::make_unique<Generate>(app); }

}  // namespace dsv4::cli
