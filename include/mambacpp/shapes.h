// Configurations of released models by name, for benchmarks on random weights of real shapes.
#pragma once

#include <string>
#include <vector>

#include "mambacpp/config.h"

namespace mambacpp {

// "mamba-130m", "mamba-370m", "mamba-1.4b", "mamba-2.8b", "mamba2-130m", "mamba2-370m", "mamba2-1.3b",
// "mamba2-2.7b", and the hybrids "granite-4.0-h-1b", "granite-4.0-h-350m". Throws Error listing the known names
// otherwise.
ModelConfig named_shape(const std::string& name);
std::vector<std::string> named_shapes();

}  // namespace mambacpp
