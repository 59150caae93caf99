#include "app/commands/predict/image_files.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <system_error>

#include "data/data_error.h"
#include "data/eval_crop.h"
#include "data/image_codec.h"

namespace trainer {
namespace {

// The file's bytes into `bytes`; "" or why they could not be read.
std::string read_file(const std::string& path, std::vector<uint8_t>& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open: " + std::error_code(errno, std::generic_category()).message();
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) return "read error: " + std::error_code(errno, std::generic_category()).message();
  return "";
}

}  // namespace

ImageFiles::ImageFiles(std::vector<std::string> paths, const EvalTransform& transform, BadSampleWarn warn)
    : paths_(std::move(paths)),
      transform_(transform),
      bad_(std::make_unique<BadSampleTracker>(std::move(warn))) {}

std::string ImageFiles::try_load(int64_t index, uint8_t* hwc_out) const {
  thread_local std::vector<uint8_t> bytes;
  if (std::string problem = read_file(path(index), bytes); !problem.empty()) return problem;
  try {
    decode_eval_crop(bytes.data(), bytes.size(), transform_.channels, transform_.resize, transform_.crop,
                     hwc_out);
  } catch (const ImageDecodeError& e) {
    return e.what();
  }
  return "";
}

void ImageFiles::read_into(int64_t index, uint8_t* hwc_out) const {
  check_index(index);
  if (const std::string problem = try_load(index, hwc_out); !problem.empty())
    throw DataError(path(index) + ": " + problem);
}

int64_t ImageFiles::read_augmented(int64_t index, uint8_t* hwc_out, Generator&) const {
  check_index(index);
  const std::string problem = try_load(index, hwc_out);
  if (problem.empty()) return index;
  {
    std::lock_guard lock(mutex_);
    problems_[index] = problem;
  }
  bad_->mark_bad(index,
                 "warning: " + path(index) + ": " + problem +
                     "; skipping it (as data.bad_samples = \"skip\"): it is left out of the predictions");
  return kDroppedSample;
}

std::string ImageFiles::problem(int64_t index) const {
  std::lock_guard lock(mutex_);
  const auto it = problems_.find(index);
  return it == problems_.end() ? std::string() : it->second;
}

}  // namespace trainer
