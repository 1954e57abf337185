// The tensor-parallel harness of the TP tests: one model rank (a fixture's checkpoint or synthetic
// weights) driven through a fixed ragged schedule, and a group of ranks as threads of this
// process over Gloo (the rendezvous store on loopback). Used by the CPU suite
// (tests/tensor_parallel) and the GPU one (tests/gpu/cuda_tp_test.cc).
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "parallel/gloo_communicator.h"
#include "parallel/rendezvous_service.h"
#include "parallel/rendezvous_store.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/dsv4_model.h"
#include "worker/model/local_sequences.h"

namespace dsv4::testing {

using Logits = SequenceStep::Logits;

// Where the weights come from: a fixture directory or synthetic weights of its config.
struct Source {
  std::string dir;
  bool synthetic = false;
  bool released_formats = false;
};

// Runs three prompts as one ragged batch over three steps (prefill chunks and decode tokens
// mixed) and returns every logit row, in order.
inline absl::StatusOr<std::vector<float>> RunSteps(Dsv4Model& model, int64_t vocab) {
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 17, 29, 5, 11, 40, 2, 9, 33, 7, 21, 14, 8},
      {50, 4, 19, 23, 6},
      {12, 12, 31, 44, 1, 18, 27, 3, 36, 10, 15, 25, 30, 2, 16, 5, 13, 22, 38}};
  const std::vector<std::vector<int>> schedule = {{6, 1, 6}, {1, 4, 0}, {9, 9, 1}};
  LocalSequences seqs(model, /*reverse_blocks=*/true);
  std::vector<int> ids;
  std::vector<size_t> pos(prompts.size(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSIGN_OR_RETURN(int id, seqs.Create());
    ids.push_back(id);
  }
  std::vector<float> all;
  for (int step = 0; step < 3; ++step) {
    std::vector<SequenceStep> steps;
    std::vector<size_t> who, count;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const size_t n = std::min<size_t>(schedule[i][step], prompts[i].size() - pos[i]);
      if (n == 0) continue;
      ASSIGN_OR_RETURN(SequenceStep s, seqs.Next(ids[i], std::span(prompts[i]).subspan(pos[i], n),
                                                 Logits::kAll));
      steps.push_back(s);
      who.push_back(i);
      count.push_back(n);
    }
    StepLogits out;
    RETURN_IF_ERROR(model.Step(steps, StepOptions{}, &out));
    if (out.vocab != vocab) return absl::InternalError("vocab");
    all.insert(all.end(), out.values.begin(), out.values.end());
    for (size_t r = 0; r < who.size(); ++r) {
      seqs.Advance(ids[who[r]], static_cast<int64_t>(count[r]));
      pos[who[r]] += count[r];
    }
  }
  return all;
}

// Every logit row of RunSteps for rank `layout` of `src`, on the backend `make_backend` builds
// (given this rank's communicator; null at size 1).
using BackendMaker = std::function<absl::StatusOr<std::unique_ptr<Backend>>(Communicator*)>;

inline BackendMaker CpuBackends() {
  return [](Communicator* comm) -> absl::StatusOr<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(comm));
  };
}

inline absl::StatusOr<std::vector<float>> RunRank(const Source& src, const ParallelLayout& layout,
                                                  Communicator* comm,
                                                  const BackendMaker& make_backend = CpuBackends()) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(src.dir + "/config.json"));
  CacheConfig cache;
  cache.num_blocks = 16;
  cache.num_slots = 4;
  cache.max_model_len = 256;
  LoadOptions options;
  options.parallel = layout;
  options.synthetic_released_formats = src.released_formats;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(comm));
  std::unique_ptr<Dsv4Model> model;
  if (src.synthetic) {
    ASSIGN_OR_RETURN(model, Dsv4Model::LoadSynthetic(config, 7, std::move(backend), cache, options));
  } else {
    ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(src.dir));
    ASSIGN_OR_RETURN(model, Dsv4Model::Load(config, *ckpt, std::move(backend), cache, options));
  }
  return RunSteps(*model, config.vocab_size);
}

// Ranks as threads: forms a group of n over a rendezvous store of its own per call.
class TpGroup {
 public:
  TpGroup() {
    auto server = RendezvousServer::Start("127.0.0.1:0", &store_);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }

  // Every rank's logits (rank order) for `src` on `n` ranks.
  std::vector<std::vector<float>> RunGroup(const Source& src, int n,
                                           const BackendMaker& make_backend = CpuBackends()) {
    const std::string group = absl::StrCat("g", next_group_++);
    const std::string token = *NewRendezvousToken();
    EXPECT_TRUE(store_.OpenGroup(group, n, token).ok());
    std::vector<std::vector<float>> logits(n);
    std::vector<absl::Status> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        GlooOptions o;
        o.rank = r;
        o.world_size = n;
        o.connect_timeout = std::chrono::seconds(10);
        o.op_timeout = std::chrono::seconds(30);
        auto comm = GlooCommunicator::Connect(
            o, {absl::StrCat("127.0.0.1:", server_->port()), group, token});
        if (!comm.ok()) {
          errors[r] = comm.status();
          return;
        }
        auto got = RunRank(src, {r, n}, comm->get(), make_backend);
        if (got.ok()) {
          logits[r] = std::move(*got);
        } else {
          errors[r] = got.status();
          (*comm)->Abort(got.status());
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(errors[r].ok()) << "rank " << r << ": " << errors[r];
    return logits;
  }

 private:
  RendezvousStore store_;
  std::unique_ptr<RendezvousServer> server_;
  int next_group_ = 0;
};

}  // namespace dsv4::testing
