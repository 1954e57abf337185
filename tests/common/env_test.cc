#include "common/env.h"

#include <cstdlib>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

constexpr const char* kVar = "DSV4_ENV_TEST_SWITCH";

TEST(Env, UnsetGivesTheDefault) {
  unsetenv(kVar);
  EXPECT_EQ(*EnvChoice(kVar, {"narrow", "wide"}, 0), 0);
  EXPECT_EQ(*EnvChoice(kVar, {"narrow", "wide"}, 1), 1);
  EXPECT_TRUE(*EnvBool(kVar, true));
  EXPECT_FALSE(*EnvBool(kVar, false));
}

TEST(Env, AcceptedValuesMapToTheirIndex) {
  setenv(kVar, "wide", 1);
  EXPECT_EQ(*EnvChoice(kVar, {"narrow", "wide"}, 0), 1);
  setenv(kVar, "0", 1);
  EXPECT_FALSE(*EnvBool(kVar, true));
  setenv(kVar, "1", 1);
  EXPECT_TRUE(*EnvBool(kVar, false));
  unsetenv(kVar);
}

TEST(Env, AnythingElseIsAnErrorNamingTheVariableAndTheChoices) {
  for (const char* bad : {"Wide", "", "yes", "2", " 1"}) {
    setenv(kVar, bad, 1);
    const absl::StatusOr<int> c = EnvChoice(kVar, {"narrow", "wide"}, 0);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(kVar), std::string::npos);
    EXPECT_NE(c.status().message().find("narrow, wide"), std::string::npos);
    EXPECT_FALSE(EnvBool(kVar, false).ok()) << bad;
  }
  unsetenv(kVar);
}

TEST(Env, SubsetsAreBitSetsAndUnknownItemsAreErrors) {
  constexpr std::string_view kValues[] = {"a", "bb", "c"};
  unsetenv(kVar);
  EXPECT_EQ(*EnvSubset(kVar, kValues), 0u);
  setenv(kVar, "", 1);
  EXPECT_EQ(*EnvSubset(kVar, kValues), 0u);
  setenv(kVar, "c", 1);
  EXPECT_EQ(*EnvSubset(kVar, kValues), 4u);
  setenv(kVar, "bb,a,bb", 1);
  EXPECT_EQ(*EnvSubset(kVar, kValues), 3u);
  for (const char* bad : {"b", "a,", ",a", "a, bb", "A", "a,,c"}) {
    setenv(kVar, bad, 1);
    const absl::StatusOr<uint32_t> s = EnvSubset(kVar, kValues);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(kVar), std::string::npos);
    EXPECT_NE(s.status().message().find("a, bb, c"), std::string::npos);
  }
  unsetenv(kVar);
}

}  // namespace
}  // namespace dsv4
