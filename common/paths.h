// Locating the embedded default model (models/dsv4-tiny in the source tree, or
// <prefix>/share/dsv4-node/models/dsv4-tiny in an installed image).
#pragma once

#include <string>

namespace dsv4 {

// Directory of the running executable ("" if unknown).
std::string ExecutableDir();

// The default model directory: $DSV4_MODEL_DIR, then next to the executable
// (../share/dsv4-node/models/dsv4-tiny, ../models/dsv4-tiny), then the source tree's
// models/dsv4-tiny. Returns the first that holds a config.json ("" if none).
std::string DefaultModelDir();

}  // namespace dsv4
