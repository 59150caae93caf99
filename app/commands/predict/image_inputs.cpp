#include "app/commands/predict/image_inputs.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "app/common/cli.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

bool has_image_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// A directory's image files at any depth, sorted by path (byte order) so that output order is stable.
void add_directory(const fs::path& dir, std::vector<std::string>& out) {
  std::vector<std::string> found;
  std::error_code error;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, error), end;
       !error && it != end; it.increment(error)) {
    std::error_code type_error;
    if (it->is_regular_file(type_error) && has_image_extension(it->path()))
      found.push_back(it->path().string());
  }
  if (error) throw UsageError("cannot list " + dir.string() + ": " + error.message());
  std::sort(found.begin(), found.end());
  out.insert(out.end(), found.begin(), found.end());
}

void add_path(const std::string& path, std::vector<std::string>& out) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::is_directory(status))
    add_directory(path, out);
  else if (fs::exists(status))
    out.push_back(path);  // a file named explicitly is tried whatever it is: a bad one is reported
  else
    throw UsageError("no such file or directory: " + path);
}

}  // namespace

std::vector<std::string> collect_image_paths(const std::vector<std::string>& arguments,
                                             std::istream& stdin_list) {
  std::vector<std::string> paths;
  for (const std::string& argument : arguments) {
    if (argument != "-") {
      add_path(argument, paths);
      continue;
    }
    // A listed file that does not exist is a bad file of the batch, not the end of it.
    for (std::string line; std::getline(stdin_list, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      std::error_code error;
      if (fs::is_directory(line, error))
        add_directory(line, paths);
      else
        paths.push_back(line);
    }
  }
  if (paths.empty())
    throw UsageError("no image files found in " + std::to_string(arguments.size()) + " path(s)");
  return paths;
}

}  // namespace trainer
