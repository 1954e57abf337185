#include "common/plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/paths.h"

namespace dsv4 {

absl::StatusOr<Plugin> Plugin::Open(const std::string& path) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load plugin ", path, ": ", err != nullptr ? err : "unknown error"));
  }
  Plugin p;
  p.handle_ = handle;
  p.path_ = path;
  return p;
}

Plugin::Plugin(Plugin&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), path_(std::move(other.path_)) {}

Plugin& Plugin::operator=(Plugin&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) ::dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

Plugin::~Plugin() {
  if (handle_ != nullptr) ::dlclose(handle_);
}

absl::StatusOr<void*> Plugin::Symbol(const char* name) const {
  ::dlerror();
  void* sym = ::dlsym(handle_, name);
  if (sym == nullptr) {
    return absl::NotFoundError(absl::StrCat("plugin ", path_, " has no symbol ", name));
  }
  return sym;
}

std::string DefaultCudaPluginPath() {
  if (const char* env = std::getenv("DSV4_CUDA_PLUGIN"); env != nullptr) return env;
  struct stat st;
  const std::string exe = ExecutableDir();
  const std::string next_to_exe = exe + "/libdsv4_cuda.so";
  if (::stat(next_to_exe.c_str(), &st) == 0) return next_to_exe;
  // Build tree and GPU bundle layout: <root>/{node,tests}/binary, <root>/worker/libdsv4_cuda.so.
  const std::string sibling = exe + "/../worker/libdsv4_cuda.so";
  if (::stat(sibling.c_str(), &st) == 0) return sibling;
  // Installed layout (scripts/package.sh): <prefix>/bin/dsv4-node, <prefix>/lib/dsv4-node/.
  const std::string installed = exe + "/../lib/dsv4-node/libdsv4_cuda.so";
  if (::stat(installed.c_str(), &st) == 0) return installed;
#ifdef DSV4_BINARY_DIR
  return std::string(DSV4_BINARY_DIR) + "/worker/libdsv4_cuda.so";
#else
  return next_to_exe;
#endif
}

}  // namespace dsv4
