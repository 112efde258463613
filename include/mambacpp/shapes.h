// Configurations of released models by name, for benchmarks on random weights of real shapes.
#pragma once

#include <string>
#include <vector>

#include "mambacpp/config.h"

namespace mambacpp {

// "mamba-130m", "mamba-370m", "mamba-1.4b", "mamba-2.8b", "mamba2-130m", "mamba2-370m", "mamba2-1.3b",
// "mamba2-2.7b", the hybrids "granite-4.0-h-1b", "granite-4.0-h-350m", "nemotron-h-8b", "bamba-9b", and the
// mixture-of-experts hybrids "nemotron-3-nano-30b-a3b", "granite-4.0-h-tiny", "granite-4.0-h-small", "jamba-mini". Throws Error listing the known names
// otherwise.
ModelConfig named_shape(const std::string& name);
std::vector<std::string> named_shapes();

}  // namespace mambacpp
