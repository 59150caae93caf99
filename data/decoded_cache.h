#pragma once
// data.cache = "decoded": an image kept in the cache (data/file_cache.h) as uint8 HWC pixels, downscaled
// so that its shorter side is at most decoded_cache_short_side(image_size), behind a small header that
// keeps the original size. Later epochs then crop and resize from memory instead of decoding a JPEG.
//
// The bound is the evaluation resize, image_size * 256 / 224 (256 for 224), as the "resize the shorter
// side to 256" image caches of DALI and FFCV pipelines do:
//   - evaluation (Resize(256) + CenterCrop(224)) needs no more pixels than that: from the cache it is
//     the centre crop of the kept image, with the same geometry as from the file;
//   - a RandomResizedCrop box is still drawn on the ORIGINAL size, from the same generator draws as
//     without the cache, and then mapped into the kept image, so the crops cover the same part of the
//     picture; only the pixels differ, by resampling. A crop that keeps less than (224/256)^2 = 77% of
//     a 256-pixel image's area is upsampled from fewer source pixels than the file has (a
//     500x375 JPEG has 2.1x the pixels): smaller crops are softer than without the cache;
//   - memory: a 4:3 image takes 256 x 341 x 3 = 262 KB (a 500x375 JPEG is ~110 KB as a file), about
//     2.4x data.cache = "encoded" per image. Keeping enough pixels for the smallest crops
//     (scale 0.08: a shorter side of 224 / sqrt(0.08) = 792) would keep ImageNet's images whole,
//     ~720 GB, which no node's memory holds.
// An image whose shorter side is within the bound already is kept as decoded, never upscaled.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/image_codec.h"
#include "data/resized_crop.h"
#include "nn/random.h"

namespace trainer {

// The shorter side images are kept at: the evaluation resize of image_size (256 for 224).
int64_t decoded_cache_short_side(int64_t image_size);

// The kept size of a height x width image: its shorter side scaled to short_side (truncated as
// torchvision's Resize does), or its own size when that is no larger.
void decoded_cache_size(int64_t height, int64_t width, int64_t short_side, int64_t& kept_height,
                        int64_t& kept_width);

// Bytes of the entry of a kept_height x kept_width image of `channels` channels, header included.
size_t decoded_entry_bytes(int64_t kept_height, int64_t kept_width, int64_t channels);

// What `files` entries can need at most, for FileCache's cap: each at the bound with an aspect ratio
// of 2 (ImageNet's images are 4:3 on average; an image more elongated than 2:1 takes room another
// one would have had). The budget is usually the tighter cap.
uint64_t decoded_cache_most_bytes(int64_t files, int64_t short_side, int64_t channels);

// Decodes the image (JPEG or PNG, `info` its header) to `channels` channels and writes its entry into
// `entry`: header, then the pixels downscaled to decoded_cache_size. A JPEG is decoded at the DCT
// scale that keeps at least the kept size. Throws ImageDecodeError for a corrupt or truncated image.
void make_decoded_entry(const uint8_t* data, size_t size, const ImageInfo& info, int64_t channels,
                        int64_t short_side, std::vector<uint8_t>& entry);

// An entry read back.
struct DecodedEntry {
  int64_t height = 0;  // the original image's size, on which crops are drawn
  int64_t width = 0;
  int64_t kept_height = 0;  // the pixels' size
  int64_t kept_width = 0;
  int64_t channels = 0;
  const uint8_t* pixels = nullptr;  // [kept_height, kept_width, channels]
};

// Throws std::logic_error when the bytes are not an entry of `channels` channels (a cache shared with
// a process of other settings would be a bug: the shared name holds the dataset's fingerprint).
DecodedEntry read_decoded_entry(const uint8_t* entry, size_t size, int64_t channels);

// RandomResizedCrop(size, crop) from an entry: the box drawn on the original size (the same draws, the
// same box as from the file), mapped into the kept pixels and resized to [size, size, channels].
void random_resized_crop_from_entry(const DecodedEntry& image, const RandomResizedCropConfig& crop,
                                    Generator& gen, uint8_t* hwc_out, int64_t size);

// Resize(eval_resize_size(size)) + CenterCrop(size) from an entry, the box computed on the original
// size as from the file.
void center_crop_from_entry(const DecodedEntry& image, uint8_t* hwc_out, int64_t size);

}  // namespace trainer
