#pragma once
// File-system errors the user can cause (a path that cannot be created, a read-only or full disk) in
// the trainer's own words: what could not be done, where, why, and a HINT to act on. The standard
// library's text ("filesystem error: cannot create directories: Permission denied [...]") names
// neither the setting behind the path nor what to do.
#include <filesystem>
#include <string>
#include <system_error>

#include "nn/file_error_hint.h"

namespace trainer {

// "cannot create directories /x/y: Permission denied. HINT: ..." for a std::filesystem error.
std::string describe_filesystem_error(const std::filesystem::filesystem_error& e);

}  // namespace trainer
