#include "data/decoded_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace trainer {
namespace {

// The entry's first bytes; the pixels follow.
struct EntryHeader {
  uint32_t magic;
  uint32_t channels;
  uint32_t height, width;            // original
  uint32_t kept_height, kept_width;  // pixels
};
static_assert(sizeof(EntryHeader) == 24);

constexpr uint32_t kMagic = 0x64636431;  // "dcd1"

}  // namespace

int64_t decoded_cache_short_side(int64_t image_size) { return eval_resize_size(image_size); }

void decoded_cache_size(int64_t height, int64_t width, int64_t short_side, int64_t& kept_height,
                        int64_t& kept_width) {
  if (std::min(height, width) <= short_side) {
    kept_height = height;
    kept_width = width;
    return;
  }
  resized_shorter_side(height, width, short_side, kept_height, kept_width);
}

size_t decoded_entry_bytes(int64_t kept_height, int64_t kept_width, int64_t channels) {
  return sizeof(EntryHeader) + static_cast<size_t>(kept_height * kept_width * channels);
}

uint64_t decoded_cache_most_bytes(int64_t files, int64_t short_side, int64_t channels) {
  return static_cast<uint64_t>(files) * decoded_entry_bytes(short_side, 2 * short_side, channels);
}

void make_decoded_entry(const uint8_t* data, size_t size, const ImageInfo& info, int64_t channels,
                        int64_t short_side, std::vector<uint8_t>& entry) {
  int64_t kept_height = 0, kept_width = 0;
  decoded_cache_size(info.height, info.width, short_side, kept_height, kept_width);
  const double min_scale = std::max(static_cast<double>(kept_height) / static_cast<double>(info.height),
                                    static_cast<double>(kept_width) / static_cast<double>(info.width));
  thread_local DecodedImage decoded;
  decode_image(data, size, channels, decoded, min_scale);
  entry.resize(decoded_entry_bytes(kept_height, kept_width, channels));
  const EntryHeader header{kMagic,
                           static_cast<uint32_t>(channels),
                           static_cast<uint32_t>(info.height),
                           static_cast<uint32_t>(info.width),
                           static_cast<uint32_t>(kept_height),
                           static_cast<uint32_t>(kept_width)};
  std::memcpy(entry.data(), &header, sizeof header);
  resize_region(decoded.pixels.data(), decoded.height, decoded.width, channels,
                {0, 0, decoded.height, decoded.width}, entry.data() + sizeof header, kept_height, kept_width);
}

DecodedEntry read_decoded_entry(const uint8_t* entry, size_t size, int64_t channels) {
  EntryHeader header{};
  if (size >= sizeof header) std::memcpy(&header, entry, sizeof header);
  if (header.magic != kMagic || header.channels != channels ||
      size != decoded_entry_bytes(header.kept_height, header.kept_width, channels))
    throw std::logic_error("data.cache = \"decoded\": an entry of " + std::to_string(size) +
                           " bytes is not an image of " + std::to_string(channels) + " channels");
  return {header.height,     header.width, header.kept_height,
          header.kept_width, channels,     entry + sizeof header};
}

void random_resized_crop_from_entry(const DecodedEntry& image, const RandomResizedCropConfig& crop,
                                    Generator& gen, uint8_t* hwc_out, int64_t size) {
  const CropBox box = random_resized_crop_box(image.height, image.width, crop, gen);
  const CropBox kept = scale_box(box, image.height, image.width, image.kept_height, image.kept_width);
  resize_region(image.pixels, image.kept_height, image.kept_width, image.channels, kept, hwc_out, size, size);
}

void center_crop_from_entry(const DecodedEntry& image, uint8_t* hwc_out, int64_t size) {
  int64_t resized_height = 0, resized_width = 0;
  resized_shorter_side(image.height, image.width, eval_resize_size(size), resized_height, resized_width);
  const CropBox center = center_crop_box(resized_height, resized_width, size);
  // When the kept image is the resized one (every image larger than the bound), this is a plain copy.
  const CropBox kept = scale_box(center, resized_height, resized_width, image.kept_height, image.kept_width);
  resize_region(image.pixels, image.kept_height, image.kept_width, image.channels, kept, hwc_out, size, size);
}

}  // namespace trainer
