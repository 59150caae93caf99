#include "data/dataset.h"

#include <cstdio>
#include <stdexcept>

namespace trainer {

Sample Dataset::get(int64_t index) const {
  Sample sample;
  sample.pixels.resize(static_cast<size_t>(sample_bytes()));
  read_into(index, sample.pixels.data());
  sample.label = label(index);
  return sample;
}

int64_t Dataset::read_augmented(int64_t index, uint8_t* hwc_out, Generator& /*gen*/) const {
  read_into(index, hwc_out);
  return label(index);
}

void Dataset::check_index(int64_t index) const {
  if (index < 0 || index >= size())
    throw std::out_of_range(name() + ": sample index " + std::to_string(index) + " outside [0, " +
                            std::to_string(size()) + ")");
}

std::string Dataset::describe(uint64_t content_hash) const {
  std::string classes;
  for (const std::string& class_name : class_names()) classes += (classes.empty() ? "" : ",") + class_name;
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(content_hash));
  return name() + " size=" + std::to_string(size()) + " hwc=" + std::to_string(height()) + "x" +
         std::to_string(width()) + "x" + std::to_string(channels()) + " classes=[" + classes +
         "] hash=" + hash;
}

}  // namespace trainer
