// A run-time-loaded shared library (dlopen). GPU code lives in such a plugin so that the
// coordinator never links cuBLAS (whose TLS breaks the civetweb exposer threads, toolchain.md)
// and still runs where no CUDA libraries exist. Move-only RAII owner of the handle.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dsv4 {

class Plugin {
 public:
  // dlopen(path, RTLD_NOW | RTLD_LOCAL). FailedPrecondition with dlerror() text on failure.
  static absl::StatusOr<Plugin> Open(const std::string& path);

  Plugin() = default;
  Plugin(Plugin&& other) noexcept;
  Plugin& operator=(Plugin&& other) noexcept;
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;
  ~Plugin();

  // Looks up an extern "C" symbol.
  absl::StatusOr<void*> Symbol(const char* name) const;
  template <typename Fn>
  absl::StatusOr<Fn*> Function(const char* name) const {
    auto p = Symbol(name);
    if (!p.ok()) return p.status();
    return reinterpret_cast<Fn*>(*p);
  }

 private:
  void* handle_ = nullptr;
  std::string path_;
};

// The CUDA plugin's path: $DSV4_CUDA_PLUGIN, else libdsv4_cuda.so next to the executable, else
// the build tree's copy.
std::string DefaultCudaPluginPath();

}  // namespace dsv4
