#include "common/paths.h"

#include <unistd.h>

#include <cstdlib>
#include <vector>

#include <sys/stat.h>

namespace dsv4 {
namespace {
bool HasConfig(const std::string& dir) {
  struct stat st;
  return !dir.empty() && ::stat((dir + "/config.json").c_str(), &st) == 0;
}
}  // namespace

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string DefaultModelDir() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DSV4_MODEL_DIR"); env != nullptr) candidates.push_back(env);
  const std::string exe = ExecutableDir();
  if (!exe.empty()) {
    candidates.push_back(exe + "/../share/dsv4-node/models/dsv4-tiny");
    candidates.push_back(exe + "/../models/dsv4-tiny");
    candidates.push_back(exe + "/models/dsv4-tiny");
  }
#ifdef DSV4_SOURCE_DIR
  candidates.push_back(std::string(DSV4_SOURCE_DIR) + "/models/dsv4-tiny");
#endif
  for (const auto& c : candidates) {
    if (HasConfig(c)) return c;
  }
  return "";
}

}  // namespace dsv4
