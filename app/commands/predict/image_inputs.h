#pragma once
// The files `trainer predict` classifies, from its PATH arguments: a file as given (whatever its name:
// the format is told by its bytes), a directory's JPEG and PNG files recursively (by extension, in
// sorted order, as an image folder lists them), and `-` for a list of paths on stdin, one a line.
#include <istream>
#include <string>
#include <vector>

namespace trainer {

// Throws UsageError for a path that does not exist or no files at all. `stdin_list` is read for `-`.
std::vector<std::string> collect_image_paths(const std::vector<std::string>& arguments,
                                             std::istream& stdin_list);

}  // namespace trainer
