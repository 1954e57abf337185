// GPU suite (label `gpu`). Skips cleanly where the CUDA plugin cannot load or no device exists
// (CI); on the H200 host every test must run and pass.
#include <cmath>
#include <string>
#include <vector>

#include "common/plugin.h"
#include "gtest/gtest.h"

namespace dsv4 {
namespace {

using DeviceCountFn = int(char*, int);
using ScaleAddFn = int(const float*, const float*, float, float*, int, char*, int);

class CudaProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    auto plugin = Plugin::Open(DefaultCudaPluginPath());
    if (!plugin.ok()) GTEST_SKIP() << "no CUDA plugin: " << plugin.status();
    plugin_ = std::move(*plugin);
    auto count = plugin_.Function<DeviceCountFn>("dsv4_cuda_device_count");
    ASSERT_TRUE(count.ok()) << count.status();
    char msg[256] = {0};
    devices_ = (*count)(msg, sizeof(msg));
    if (devices_ < 1) GTEST_SKIP() << "no CUDA device: " << msg;
    std::printf("CUDA devices: %d (%s)\n", devices_, msg);
  }
  Plugin plugin_;
  int devices_ = 0;
};

TEST_F(CudaProbe, KernelMatchesHost) {
  auto fn = plugin_.Function<ScaleAddFn>("dsv4_cuda_scale_add");
  ASSERT_TRUE(fn.ok());
  const int n = 100003;  // not a multiple of the block size
  std::vector<float> x(n), y(n), out(n, NAN);
  for (int i = 0; i < n; ++i) {
    x[i] = std::sin(0.01f * i);
    y[i] = 0.5f * i;
  }
  char msg[256] = {0};
  ASSERT_EQ((*fn)(x.data(), y.data(), 3.0f, out.data(), n, msg, sizeof(msg)), 0) << msg;
  for (int i = 0; i < n; ++i) ASSERT_FLOAT_EQ(out[i], 3.0f * x[i] + y[i]) << i;
}

}  // namespace
}  // namespace dsv4
