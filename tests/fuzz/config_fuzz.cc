// libFuzzer target for config.json parsing and validation.
#include <cstdint>
#include <string_view>

#include "common/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = dsv4::ParseModelConfig(std::string_view(reinterpret_cast<const char*>(data), size));
  if (config.ok() && static_cast<int64_t>(config->layer_types.size()) != config->num_layers) {
    __builtin_trap();
  }
  return 0;
}
