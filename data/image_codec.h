#pragma once
// JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libspng) images in memory, to and from uint8 HWC
// pixels. The format is told by the magic bytes, never by the file name: image collections hold PNGs
// named .jpg. Decoding converts to the channel count asked for, like PIL's convert("RGB") / ("L"):
// grey is replicated, alpha dropped, CMYK converted, RGB to grey with ITU-R 601 luma weights.
// EXIF orientation is ignored, as PIL and torchvision do. Encoding exists for tests and tools.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/data_error.h"

namespace trainer {

// A file that is not a decodable JPEG or PNG. The message says what is wrong but not which file:
// callers know the path and prepend it.
class ImageDecodeError : public DataError {
 public:
  using DataError::DataError;
};

enum class ImageFormat { unknown, jpeg, png };

ImageFormat sniff_image_format(const uint8_t* data, size_t size);
const char* to_string(ImageFormat format);

struct ImageInfo {
  ImageFormat format = ImageFormat::unknown;
  int64_t width = 0;
  int64_t height = 0;
};

struct DecodedImage {
  int64_t width = 0;
  int64_t height = 0;
  int64_t channels = 0;
  std::vector<uint8_t> pixels;  // [height, width, channels]; its capacity is reused across decodes
};

// Larger images are refused as corrupt headers or decompression bombs (PIL's limit is 179 Mpixels).
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

// Reads only the header. Throws ImageDecodeError for an unknown format or a corrupt header.
ImageInfo read_image_info(const uint8_t* data, size_t size);

// The DCT scale N/8 a JPEG is decoded at for a wanted min_scale: the smallest of 1/8, 2/8, 4/8 and 8/8
// that is at least min_scale. libjpeg-turbo's inverse DCTs for 3/8, 5/8, 6/8 and 7/8 are plain C
// (its SIMD ones are 8/8 and the reduced 4/8, 2/8, 1/8): decoding a 500x375 JPEG at 7/8 takes 1.8x the
// instructions of 8/8, at 6/8 1.5x, at 5/8 1.27x, at 3/8 1.09x that of 4/8 (callgrind). The larger
// image left is at most 2x the output, which resize_region shrinks cheaply.
int jpeg_scale_eighths(double min_scale);

// Decodes to `channels` (1 or 3) channels into out. A JPEG is decoded at jpeg_scale_eighths(min_scale),
// which is several times faster when the image is only going to be shrunk; out's size tells which
// was used. PNG ignores min_scale.
// Throws ImageDecodeError for an unknown format, a corrupt or truncated image; libjpeg's warnings
// about recoverable damage (extraneous bytes, say) are ignored, as PIL does, except a premature end.
void decode_image(const uint8_t* data, size_t size, int64_t channels, DecodedImage& out,
                  double min_scale = 1.0);

// channels: 1 (grey) or 3 (RGB); 4:4:4 chroma, so colours survive round trips well.
std::vector<uint8_t> encode_jpeg(const uint8_t* hwc, int64_t width, int64_t height, int64_t channels,
                                 int quality = 95);
// channels: 1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA); 8 bits per sample.
std::vector<uint8_t> encode_png(const uint8_t* hwc, int64_t width, int64_t height, int64_t channels);

}  // namespace trainer
