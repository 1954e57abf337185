// Multi-GPU suite (label `multi_gpu`): skips below two devices.
#include <string>

#include "common/plugin.h"
#include "gtest/gtest.h"

namespace dsv4 {
namespace {

using DeviceCountFn = int(char*, int);
using AllReduceFn = int(int, float*, char*, int);

TEST(NcclProbe, AllReduceSumsAcrossGpus) {
  auto plugin = Plugin::Open(DefaultCudaPluginPath());
  if (!plugin.ok()) GTEST_SKIP() << "no CUDA plugin: " << plugin.status();
  auto count = plugin->Function<DeviceCountFn>("dsv4_cuda_device_count");
  ASSERT_TRUE(count.ok());
  char msg[256] = {0};
  const int n = (*count)(msg, sizeof(msg));
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, found " << n << " (" << msg << ")";
  auto allreduce = plugin->Function<AllReduceFn>("dsv4_nccl_allreduce_probe");
  ASSERT_TRUE(allreduce.ok());
  float result = 0;
  ASSERT_EQ((*allreduce)(n, &result, msg, sizeof(msg)), 0) << msg;
  EXPECT_EQ(result, n * (n + 1) / 2.0f);  // ranks hold 1..n
}

}  // namespace
}  // namespace dsv4
