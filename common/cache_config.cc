#include "common/cache_config.h"

#include <numeric>

namespace dsv4 {

int32_t DefaultBlockSize(const ModelConfig& config) {
  int64_t lcm = 1;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    if (config.Ratio(l) > 0) lcm = std::lcm(lcm, config.Ratio(l));
  }
  int64_t bs = lcm;
  while (bs < 64) bs += lcm;
  return static_cast<int32_t>(bs);
}

}  // namespace dsv4
