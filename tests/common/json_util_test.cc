#include "common/json_util.h"

#include <string>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

TEST(JsonUtil, ParsesAndRejectsGarbage) {
  EXPECT_TRUE(ParseJson(R"({"a": [1, 2]})", "t").ok());
  auto bad = ParseJson(R"({"a": )", "doc.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("doc.json"), std::string::npos);
  EXPECT_FALSE(ParseJson("", "t").ok());
  EXPECT_FALSE(ParseJson("\xff\xfe", "t").ok());
}

TEST(JsonUtil, RejectsDeepNestingWithoutRecursing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto r = ParseJson(deep, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested deeper"), std::string::npos);
  // Brackets inside strings do not count.
  EXPECT_TRUE(ParseJson("{\"k\": \"" + std::string(1000, '[') + "\"}", "t").ok());
}

TEST(JsonUtil, RejectsDuplicateKeys) {
  auto r = ParseJson(R"({"a": 1, "b": {"x": 1, "x": 2}})", "t");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duplicate key \"x\""), std::string::npos);
  // The same key in sibling objects is fine.
  EXPECT_TRUE(ParseJson(R"([{"x": 1}, {"x": 2}])", "t").ok());
}

TEST(JsonUtil, TypedFields) {
  auto j = *ParseJson(R"({"i": 3, "f": 3.0, "g": 3.5, "s": "x", "b": true, "n": null,
                          "big": 18446744073709551615})", "t");
  EXPECT_EQ(**OptInt(j, "i", "cfg"), 3);
  EXPECT_EQ(**OptInt(j, "f", "cfg"), 3);
  EXPECT_FALSE(OptInt(j, "n", "cfg")->has_value());
  EXPECT_FALSE(OptInt(j, "absent", "cfg")->has_value());
  auto g = OptInt(j, "g", "cfg");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("cfg.g must be an integer"), std::string::npos);
  EXPECT_FALSE(OptInt(j, "s", "cfg").ok());
  EXPECT_FALSE(OptInt(j, "big", "cfg").ok());
  EXPECT_EQ(**OptDouble(j, "g", ""), 3.5);
  EXPECT_FALSE(OptDouble(j, "s", "").ok());
  EXPECT_EQ(**OptString(j, "s", ""), "x");
  EXPECT_FALSE(OptString(j, "i", "").ok());
  EXPECT_TRUE(**OptBool(j, "b", ""));
  EXPECT_FALSE(OptBool(j, "i", "").ok());
}

}  // namespace
}  // namespace dsv4
