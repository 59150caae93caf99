#pragma once
// `trainer predict CONFIG --weights W PATH...`: classifies image files with trained weights.
#include <string>
#include <vector>

namespace trainer {

// Returns 0 when every file was classified, 1 when any could not be (each reported), 2 on bad usage.
int predict_command(const std::vector<std::string>& args);

}  // namespace trainer
