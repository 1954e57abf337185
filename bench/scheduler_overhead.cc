// Coordinator per-step overhead, measured apart from the model: Scheduler::Schedule (plan
// building, block tables included) + Commit + the per-token bookkeeping, at N running decode
// requests. Prints measured figures; no assertions.
//   build/bench/dsv4_scheduler_bench [running=256] [context=2048] [steps=2000]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "node/scheduler/scheduler.h"

int main(int argc, char** argv) {
  using namespace dsv4;
  const int running = argc > 1 ? std::atoi(argv[1]) : 256;
  const int context = argc > 2 ? std::atoi(argv[2]) : 2048;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 2000;
  const int block_size = 128;
  const int blocks = running * ((context + steps + block_size - 1) / block_size + 1);
  KvBlockManager kv(blocks, running, block_size);
  Scheduler sched(SchedulerConfig{running, 1 << 20, 0}, &kv);
  auto spec = std::make_shared<SamplingSpec>();
  for (int i = 0; i < running; ++i) {
    SchedRequest r;
    r.id = static_cast<uint64_t>(i + 1);
    r.prompt.assign(context, 7);
    r.sampling = spec;
    sched.Add(std::move(r));
  }
  // Prefill everything (as many steps as the budget needs), then time pure decode steps.
  std::vector<uint64_t> preempted;
  StepPlan plan;
  for (bool prefilling = true; prefilling;) {
    plan = sched.Schedule(&preempted);
    sched.Commit(plan);
    prefilling = static_cast<int>(plan.seqs.size()) != running;
    for (const auto& s : plan.seqs) {
      prefilling |= s.tokens.size() != 1;
      if (s.sample) sched.AppendToken(s.request_id, 1);
    }
  }
  double schedule_s = 0, total_s = 0;
  size_t block_entries = 0;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    plan = sched.Schedule(&preempted);
    const auto t1 = std::chrono::steady_clock::now();
    sched.Commit(plan);
    for (const auto& s : plan.seqs) {
      block_entries += s.block_table.size();
      sched.AppendToken(s.request_id, 2);
    }
    const auto t2 = std::chrono::steady_clock::now();
    schedule_s += std::chrono::duration<double>(t1 - t0).count();
    total_s += std::chrono::duration<double>(t2 - t0).count();
    if (static_cast<int>(plan.seqs.size()) != running) {
      std::fprintf(stderr, "step %d scheduled %zu of %d\n", step, plan.seqs.size(), running);
      return 1;
    }
  }
  std::printf("running=%d context=%d block_size=%d steps=%d\n", running, context, block_size, steps);
  std::printf("schedule+plan: %.1f us/step   schedule+plan+commit+append: %.1f us/step   "
              "(avg block table %.1f entries)\n",
              1e6 * schedule_s / steps, 1e6 * total_s / steps,
              static_cast<double>(block_entries) / (static_cast<double>(steps) * running));
  return 0;
}
