#include "worker/tools/golden_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/status.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/local_sequences.h"
#include "worker/checkpoint/safetensors.h"

namespace dsv4 {
namespace {

struct Prompt {
  std::string name;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> greedy_ids;
  int64_t chunk_split = 0;
};

absl::StatusOr<std::vector<int32_t>> IdList(const Json& p, const char* key, const std::string& where,
                                            int64_t vocab) {
  auto it = p.find(key);
  if (it == p.end() || !it->is_array() || it->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " must be a non-empty list"));
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < it->size(); ++i) {
    ASSIGN_OR_RETURN(int64_t id, JsonToInt((*it)[i], absl::StrCat(where, ".", key, "[", i, "]")));
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".", key, "[", i, "] = ", id,
                                                     " is outside the vocabulary"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// Reads an F32 tensor of the golden file with the expected shape.
absl::StatusOr<std::vector<float>> GoldenTensor(const Checkpoint& g, const std::string& name,
                                                std::vector<int64_t> shape) {
  const TensorInfo* t = g.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("golden.safetensors lacks ", name));
  if (t->dtype != DType::kF32 || t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("golden tensor ", name, " has an unexpected "
                                                   "shape or dtype"));
  }
  std::vector<float> v(t->numel());
  std::memcpy(v.data(), g.Bytes(*t).data, t->nbytes);
  return v;
}

double MaxAbs(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

int32_t Argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

bool GoldenReport::pass() const {
  return !items.empty() &&
         std::all_of(items.begin(), items.end(), [](const GoldenItem& i) { return i.pass; });
}

double GoldenReport::max_abs() const {
  double m = 0;
  for (const auto& i : items) m = std::max(m, i.max_abs);
  return m;
}

absl::StatusOr<GoldenReport> RunGoldenCheck(const std::string& dir, const GoldenOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "/config.json"));
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/golden.json", 64 << 20));
  ASSIGN_OR_RETURN(Json golden, ParseJson(text, "golden.json"));
  if (!golden.is_object() || !golden.contains("prompts") || !golden["prompts"].is_array()) {
    return absl::InvalidArgumentError("golden.json: missing prompts list");
  }
  GoldenReport report;
  report.tolerance = 2e-3;
  if (auto tol = golden.find("tolerance"); tol != golden.end() && tol->is_object()) {
    ASSIGN_OR_RETURN(auto v, OptDouble(*tol, "logits_max_abs", "golden.json.tolerance"));
    if (v.has_value()) report.tolerance = *v;
  }
  std::vector<Prompt> prompts;
  int64_t longest = 0;
  for (size_t i = 0; i < golden["prompts"].size(); ++i) {
    const Json& p = golden["prompts"][i];
    const std::string where = absl::StrCat("golden.json.prompts[", i, "]");
    if (!p.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an object"));
    Prompt prompt;
    ASSIGN_OR_RETURN(auto name, OptString(p, "name", where));
    prompt.name = name.value_or(absl::StrCat("p", i));
    ASSIGN_OR_RETURN(prompt.input_ids, IdList(p, "input_ids", where, config.vocab_size));
    ASSIGN_OR_RETURN(prompt.greedy_ids, IdList(p, "greedy_ids", where, config.vocab_size));
    ASSIGN_OR_RETURN(auto split, OptInt(p, "chunk_split", where));
    prompt.chunk_split = split.value_or(static_cast<int64_t>(prompt.input_ids.size()) / 2);
    if (prompt.chunk_split < 1 || prompt.chunk_split >= static_cast<int64_t>(prompt.input_ids.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".chunk_split is outside the prompt"));
    }
    longest = std::max<int64_t>(longest, prompt.input_ids.size() + prompt.greedy_ids.size());
    prompts.push_back(std::move(prompt));
  }
  if (prompts.empty()) return absl::InvalidArgumentError("golden.json: no prompts");
  ASSIGN_OR_RETURN(auto gfile, Checkpoint::Open(dir + "/golden.safetensors"));
  ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(dir));

  CacheConfig cache = options.cache;
  const int32_t bs = cache.block_size > 0 ? cache.block_size : DefaultBlockSize(config);
  cache.block_size = bs;
  const int64_t per_seq = (longest + bs - 1) / bs;
  if (cache.num_slots == 0) cache.num_slots = static_cast<int32_t>(prompts.size()) + 1;
  if (cache.num_blocks == 0) cache.num_blocks = static_cast<int32_t>(per_seq * (prompts.size() + 1));
  std::unique_ptr<Backend> backend =
      options.make_backend ? options.make_backend() : std::make_unique<CpuBackend>();
  ASSIGN_OR_RETURN(auto model, Dsv4Model::Load(config, *ckpt, std::move(backend), cache, options.load));
  const int64_t V = config.vocab_size;
  StepOptions step_opts;
  step_opts.force_indexer_scoring = options.force_indexer_scoring;

  auto add = [&](std::string name, double err, std::string detail = "") {
    GoldenItem item{std::move(name), err, err <= report.tolerance && detail.empty(),
                    std::move(detail)};
    report.items.push_back(std::move(item));
  };
  using Logits = SequenceStep::Logits;
  // Runs one sequence chunk by chunk; returns the logits of the final chunk.
  auto run = [&](LocalSequences& seqs, int id, std::span<const int32_t> tokens, Logits mode,
                 StepLogits* out) -> absl::Status {
    ASSIGN_OR_RETURN(SequenceStep step, seqs.Next(id, tokens, mode));
    RETURN_IF_ERROR(model->Step({&step, 1}, step_opts, out));
    seqs.Advance(id, static_cast<int64_t>(tokens.size()));
    return absl::OkStatus();
  };

  for (const Prompt& p : prompts) {
    const int64_t len = static_cast<int64_t>(p.input_ids.size());
    const int64_t steps = static_cast<int64_t>(p.greedy_ids.size());
    LocalSequences seqs(*model, /*reverse_blocks=*/true);
    StepLogits logits;
    // 1. One forward over the whole prompt: logits at every position.
    {
      ASSIGN_OR_RETURN(auto ref, GoldenTensor(*gfile, p.name + ".prefill_logits", {len, V}));
      ASSIGN_OR_RETURN(int id, seqs.Create());
      RETURN_IF_ERROR(run(seqs, id, p.input_ids, Logits::kAll, &logits));
      seqs.Release(id);
      add(p.name + ".prefill_logits", MaxAbs(logits.values, ref));
    }
    // 2. Prompt through the cache, then one token at a time.
    {
      ASSIGN_OR_RETURN(auto ref, GoldenTensor(*gfile, p.name + ".decode_logits", {steps, V}));
      ASSIGN_OR_RETURN(int id, seqs.Create());
      RETURN_IF_ERROR(run(seqs, id, p.input_ids, Logits::kLast, &logits));
      double err = 0;
      std::string detail;
      for (int64_t i = 0; i < steps; ++i) {
        if (i > 0) {
          RETURN_IF_ERROR(run(seqs, id, {&p.greedy_ids[i - 1], 1}, Logits::kLast, &logits));
        }
        err = std::max(err, MaxAbs(logits.Row(0), {ref.data() + i * V, static_cast<size_t>(V)}));
        const int32_t ours = Argmax(logits.Row(0));
        if (ours != p.greedy_ids[i] && detail.empty()) {
          detail = absl::StrCat("greedy id ", i, ": ours ", ours, ", reference ", p.greedy_ids[i]);
        }
      }
      seqs.Release(id);
      add(p.name + ".decode_logits", err, detail);
    }
    // 3. Two chunks: [0, split) then [split, len).
    {
      ASSIGN_OR_RETURN(auto ref, GoldenTensor(*gfile, p.name + ".chunked_last_logits", {V}));
      ASSIGN_OR_RETURN(int id, seqs.Create());
      std::span<const int32_t> all(p.input_ids);
      RETURN_IF_ERROR(run(seqs, id, all.subspan(0, p.chunk_split), Logits::kNone, &logits));
      RETURN_IF_ERROR(run(seqs, id, all.subspan(p.chunk_split), Logits::kLast, &logits));
      seqs.Release(id);
      add(p.name + ".chunked_last_logits", MaxAbs(logits.Row(0), ref));
    }
  }

  if (options.batched && prompts.size() > 1) {
    // Every prompt in one ragged prefill step, then teacher-forced decode steps together.
    LocalSequences seqs(*model);
    std::vector<int> ids;
    std::vector<SequenceStep> steps;
    for (const Prompt& p : prompts) {
      ASSIGN_OR_RETURN(int id, seqs.Create());
      ids.push_back(id);
      ASSIGN_OR_RETURN(SequenceStep s, seqs.Next(id, p.input_ids, Logits::kAll));
      steps.push_back(s);
    }
    StepLogits logits;
    RETURN_IF_ERROR(model->Step(steps, step_opts, &logits));
    double prefill_err = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t len = static_cast<int64_t>(prompts[i].input_ids.size());
      ASSIGN_OR_RETURN(auto ref, GoldenTensor(*gfile, prompts[i].name + ".prefill_logits", {len, V}));
      const std::span<const float> ours(logits.values.data() + logits.seq_row_begin[i] * V,
                                        static_cast<size_t>(len * V));
      prefill_err = std::max(prefill_err, MaxAbs(ours, ref));
      seqs.Advance(ids[i], len);
    }
    add("batch.prefill_logits", prefill_err);
    double decode_err = 0;
    std::string detail;
    size_t max_steps = 0;
    for (const Prompt& p : prompts) max_steps = std::max(max_steps, p.greedy_ids.size());
    for (size_t k = 1; k < max_steps; ++k) {
      steps.clear();
      std::vector<size_t> who;
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (k >= prompts[i].greedy_ids.size()) continue;
        ASSIGN_OR_RETURN(SequenceStep s, seqs.Next(ids[i], {&prompts[i].greedy_ids[k - 1], 1},
                                                   Logits::kLast));
        steps.push_back(s);
        who.push_back(i);
      }
      RETURN_IF_ERROR(model->Step(steps, step_opts, &logits));
      for (size_t r = 0; r < who.size(); ++r) {
        const Prompt& p = prompts[who[r]];
        seqs.Advance(ids[who[r]], 1);
        ASSIGN_OR_RETURN(auto ref, GoldenTensor(*gfile, p.name + ".decode_logits",
                                                {static_cast<int64_t>(p.greedy_ids.size()), V}));
        decode_err = std::max(decode_err,
                              MaxAbs(logits.Row(r), {ref.data() + k * V, static_cast<size_t>(V)}));
        if (Argmax(logits.Row(r)) != p.greedy_ids[k] && detail.empty()) {
          detail = absl::StrCat(p.name, " greedy id ", k, " differs");
        }
      }
    }
    add("batch.decode_logits", decode_err, detail);
  }
  return report;
}

}  // namespace dsv4
