// NCCL (parallel/nccl_communicator.h, inside the CUDA plugin) on one GPU: a one-rank group's
// collectives eagerly and captured in a CUDA graph, and the GPU worker with the model's two
// all-reduces a layer on a one-rank NCCL group (ParallelLayout::always_reduce) in FULL and
// piecewise graphs, against the same model without collectives, eagerly.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "common/status.h"
#include "parallel/communicator.h"
#include "tests/gpu/backend_pair.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/cuda_plugin.h"
#include "worker/worker_factory.h"

namespace dsv4 {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> OneRank() {
  ASSIGN_OR_RETURN(std::string id, NcclUniqueId());
  return CreateNcclCommunicator(0, 1, id, 0);
}

TEST(NcclOneRank, CollectivesEagerlyAndCapturedInAGraph) {
  DSV4_REQUIRE_GPU();
  auto comm = OneRank();
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  EXPECT_EQ(c.backend_name(), "nccl");
  EXPECT_EQ(c.memory_space(), MemorySpace::kDevice);
  const int n = 4099;
  float *send = nullptr, *recv = nullptr;
  ASSERT_EQ(cudaMalloc(&send, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, n * sizeof(float)), cudaSuccess);
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  auto fill = [&](float base) {
    std::vector<float> h(n);
    for (int i = 0; i < n; ++i) h[i] = base + i * 0.5f;
    cudaMemcpy(send, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemset(recv, 0, n * sizeof(float));
    return h;
  };
  auto got = [&] {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), recv, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  };
  // Eager: the sum over one rank is the input.
  std::vector<float> want = fill(1.0f);
  ASSERT_TRUE(c.AllReduceSum(send, recv, n, DType::kF32, st).ok());
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  EXPECT_EQ(got(), want);
  ASSERT_TRUE(c.AllGather(send, recv, n, DType::kF32, st).ok());
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  EXPECT_EQ(got(), want);
  EXPECT_TRUE(c.Barrier().ok());
  // Captured once, replayed on new inputs.
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status in_capture = c.AllReduceSum(send, recv, n, DType::kF32, st);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_TRUE(in_capture.ok()) << in_capture;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (float base : {7.0f, -3.0f, 100.0f}) {
    want = fill(base);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(got(), want) << "replay on base " << base;
  }
  // Bad arguments are refused without breaking it; Abort breaks it.
  EXPECT_FALSE(c.AllReduceSum(send, recv, n, DType::kF32, nullptr).ok());
  EXPECT_FALSE(c.AllReduceSum(send, recv, n, DType::kI32, st).ok());
  EXPECT_TRUE(c.health().ok());
  c.Abort(absl::UnavailableError("test"));
  EXPECT_FALSE(c.health().ok());
  const absl::Status after = c.AllReduceSum(send, recv, n, DType::kF32, st);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  cudaFree(send);
  cudaFree(recv);
}

struct GraphRunResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int full = 0, piecewise = 0, captures = 0, replays = 0;
};

// Two greedy requests on the tiny fixture: 12- and 20-token prompts (one piecewise step), then
// decode steps (FULL, padded to 2 tokens).
GraphRunResult Drive(Worker& w, bool graphs) {
  GraphRunResult run;
  auto spec = std::make_shared<SamplingSpec>();
  spec->logprobs = 1;
  std::vector<std::vector<int32_t>> seqs = {{3, 17, 29, 5, 11, 40, 2, 9, 33, 7, 21, 14},
                                            {50, 4, 19, 23, 6, 12, 31, 44, 1, 18, 27, 3, 36, 10,
                                             15, 25, 30, 2, 16, 5}};
  std::vector<int32_t> fed = {0, 0};
  for (int step = 0; step < 12; ++step) {
    StepPlan plan;
    plan.step_id = step + 1;
    bool decode = step > 0;
    for (int i = 0; i < 2; ++i) {
      ScheduledSeq s;
      s.request_id = i + 1;
      s.state_slot = i;
      s.block_table = {i * 4, i * 4 + 1, i * 4 + 2, i * 4 + 3};
      s.start_pos = fed[i];
      s.prompt_len = i == 0 ? 12 : 20;
      s.output_index = step;
      s.tokens = step == 0 ? seqs[i] : std::vector<int32_t>{seqs[i].back()};
      s.sample = true;
      s.sampling = spec;
      plan.seqs.push_back(s);
    }
    if (graphs) {
      plan.graph_mode = decode ? GraphMode::kFull : GraphMode::kPiecewise;
      plan.padded_tokens = decode ? 2 : 32;
    }
    auto res = w.Execute(plan);
    EXPECT_TRUE(res.ok()) << res.status();
    if (!res.ok()) return run;
    run.full += res->graph.mode == GraphMode::kFull;
    run.piecewise += res->graph.mode == GraphMode::kPiecewise;
    run.captures += res->graph.captures;
    run.replays += res->graph.replays;
    for (int i = 0; i < 2; ++i) {
      fed[i] += static_cast<int32_t>(plan.seqs[i].tokens.size());
      seqs[i].push_back(res->sampled[i].token);
      run.tokens.push_back(res->sampled[i].token);
      run.logprobs.push_back(res->sampled[i].logprob);
    }
  }
  return run;
}

TEST(NcclOneRank, ModelCollectivesInFullAndPiecewiseGraphsEqualEager) {
  DSV4_REQUIRE_GPU();
  auto comm = OneRank();
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto config = LoadModelConfig(testing::TestData("dsv4-tiny") + "/config.json");
  ASSERT_TRUE(config.ok());
  WorkerConfig wc;
  wc.precision = "fp32";
  wc.model_dir = testing::TestData("dsv4-tiny");
  wc.model = *config;
  wc.cache.num_slots = 2;
  wc.cache.num_blocks = 8;
  wc.cache.max_model_len = 256;
  auto plain = CreateCudaWorker(0);
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(BringUp(**plain, wc).ok());
  WorkerConfig with = wc;
  with.parallel.always_reduce = true;
  with.communicator = comm->get();
  auto nccl = CreateCudaWorker(0);
  ASSERT_TRUE(nccl.ok());
  const absl::Status up = BringUp(**nccl, with);
  ASSERT_TRUE(up.ok()) << up;
  const GraphRunResult eager = Drive(**plain, false);
  const GraphRunResult graphs = Drive(**nccl, true);
  EXPECT_EQ(graphs.tokens, eager.tokens);
  double worst = 0;
  for (size_t i = 0; i < eager.logprobs.size() && i < graphs.logprobs.size(); ++i) {
    worst = std::max(worst, std::fabs(double(graphs.logprobs[i]) - eager.logprobs[i]));
  }
  std::printf("    one-rank NCCL in graphs: FULL steps %d, PIECEWISE steps %d, captures %d, "
              "replays %d; max |logprob diff| vs eager without collectives %.3g\n",
              graphs.full, graphs.piecewise, graphs.captures, graphs.replays, worst);
  EXPECT_LT(worst, 1e-4);
  EXPECT_GT(graphs.full, 0);
  EXPECT_GT(graphs.piecewise, 0);
  EXPECT_GT(graphs.captures, 0);
  EXPECT_GT(graphs.replays, graphs.captures);
}

}  // namespace
}  // namespace dsv4
