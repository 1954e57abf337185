// libFuzzer target for the safetensors header parser (and, through it, the JSON parser).
//   cmake -B build-fuzz -G Ninja -DDSV4_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DDSV4_ENABLE_CUDA=OFF
//   ninja -C build-fuzz safetensors_header_fuzzer && build-fuzz/tests/safetensors_header_fuzzer
// Invariant checked on every accepted input: each tensor's bytes lie inside the file.
#include <cstdint>
#include <cstdlib>

#include "worker/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint64_t data_start = 0;
  auto tensors = dsv4::ParseSafetensorsHeader(data, size, &data_start);
  if (tensors.ok()) {
    for (const auto& t : *tensors) {
      if (data_start > size || t.begin + t.nbytes > size - data_start) std::abort();
      if (t.nbytes != static_cast<uint64_t>(t.numel()) * dsv4::DTypeSize(t.dtype)) std::abort();
    }
  }
  return 0;
}
