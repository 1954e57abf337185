#include "worker/tools/model_tools.h"

namespace dsv4::cli {

std::vector<CommandSpec> ModelToolCommands() {
  return {
      {"check-golden",
       "run every prompt of a fixture directory and compare with the reference logits",
       AddCheckGolden},
      {"generate", "generate tokens from prompt token ids", AddGenerate},
      {"bench", "measure CPU prefill and decode throughput", AddBench},
      {"worker", "run one rank of a distributed node (dials the coordinator)", AddWorker},
  };
}

}  // namespace dsv4::cli
