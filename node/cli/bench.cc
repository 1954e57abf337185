// dsv4-node bench: prefill and decode throughput of the engine on this process (CPU).
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "worker/model/local_sequences.h"

namespace dsv4::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class Bench final : public Command {
 public:
  explicit Bench(CLI::App& app) {
    flags_.Register(app);
    app.add_option("--batches", batches_, "batch sizes")->delimiter(',');
    app.add_option("--prompt-len", prompt_len_, "prompt tokens per sequence")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--decode-steps", decode_steps_, "decode steps")->check(CLI::Range(1, 1 << 20));
    app.add_option("--repeats", repeats_, "repetitions; the best is reported")
        ->check(CLI::Range(1, 1000));
  }

  int Run() override {
    for (int b : batches_) {
      if (b < 1 || b > 4096) return Fail(absl::InvalidArgumentError("--batches: sizes in [1, 4096]"));
    }
    int max_batch = 1;
    for (int b : batches_) max_batch = std::max(max_batch, b);
    auto model = flags_.Load(max_batch, prompt_len_ + decode_steps_);
    if (!model.ok()) return Fail(model.status());
    const int64_t vocab = (*model)->config().vocab_size;
    std::printf("model: %s\n", (*model)->config().Summary().c_str());
    std::printf("prompt_len=%d decode_steps=%d repeats=%d device=cpu\n", prompt_len_,
                decode_steps_, repeats_);
    std::printf("%6s %14s %14s %14s %14s\n", "batch", "prefill_tok/s", "prefill_ms", "decode_tok/s",
                "decode_ms/step");
    std::mt19937 rng(1234);
    StepOptions options;
    options.force_indexer_scoring = flags_.force_indexer_scoring;
    for (int batch : batches_) {
      double best_prefill = 1e30, best_decode = 1e30;
      for (int rep = 0; rep < repeats_; ++rep) {
        LocalSequences seqs(**model);
        std::vector<std::vector<int32_t>> prompts(batch);
        std::vector<int> ids;
        std::vector<SequenceStep> steps;
        for (int i = 0; i < batch; ++i) {
          for (int t = 0; t < prompt_len_; ++t) {
            prompts[i].push_back(static_cast<int32_t>(rng() % vocab));
          }
          auto id = seqs.Create();
          if (!id.ok()) return Fail(id.status());
          ids.push_back(*id);
          auto s = seqs.Next(*id, prompts[i], SequenceStep::Logits::kLast);
          if (!s.ok()) return Fail(s.status());
          steps.push_back(*s);
        }
        StepLogits logits;
        const auto t0 = Clock::now();
        if (auto s = (*model)->Step(steps, options, &logits); !s.ok()) return Fail(s);
        const auto t1 = Clock::now();
        best_prefill = std::min(best_prefill, Seconds(t0, t1));
        std::vector<int32_t> next(batch);
        for (int i = 0; i < batch; ++i) {
          seqs.Advance(ids[i], prompt_len_);
          next[i] = static_cast<int32_t>(rng() % vocab);
        }
        const auto t2 = Clock::now();
        for (int d = 0; d < decode_steps_; ++d) {
          steps.clear();
          for (int i = 0; i < batch; ++i) {
            auto s = seqs.Next(ids[i], {&next[i], 1}, SequenceStep::Logits::kLast);
            if (!s.ok()) return Fail(s.status());
            steps.push_back(*s);
          }
          if (auto s = (*model)->Step(steps, options, &logits); !s.ok()) return Fail(s);
          for (int i = 0; i < batch; ++i) {
            seqs.Advance(ids[i], 1);
            const auto row = logits.Row(i);
            next[i] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
          }
        }
        best_decode = std::min(best_decode, Seconds(t2, Clock::now()));
      }
      std::printf("%6d %14.1f %14.2f %14.1f %14.3f\n", batch,
                  batch * prompt_len_ / best_prefill, best_prefill * 1e3,
                  batch * decode_steps_ / best_decode, best_decode * 1e3 / decode_steps_);
    }
    return 0;
  }

 private:
  ModelFlags flags_;
  std::vector<int> batches_ = {1, 8, 32};
  int prompt_len_ = 128;
  int decode_steps_ = 32;
  int repeats_ = 3;
};

}  // namespace

std::unique_ptr<Command> AddBench(CLI::App& app) { return std::make_unique<Bench>(app); }

}  // namespace dsv4::cli
