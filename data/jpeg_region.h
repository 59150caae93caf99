#pragma once
// Decodes only the part of a JPEG that a crop keeps, at the DCT scale decode_image picks, which leaves the
// crop at least as large as the output (libjpeg-turbo's libjpeg API: jpeg_crop_scanline for the
// columns, jpeg_skip_scanlines for the rows above, and the rows below are never read).
//
// A RandomResizedCrop keeps on average about half of an image and then shrinks it to 224x224, so
// most of a full decode is thrown away. Rows above the crop are still entropy-decoded (JPEG's
// Huffman stream has no row index) but skip the inverse DCT, upsampling and colour conversion;
// columns outside it skip those too. The pixels inside the crop are those a full decode at the same
// scale gives (tests/data/jpeg_region_test.cpp compares them). Damage in the rows below the crop
// is not seen by this decode; another epoch's crop, or evaluation's, reads them.
#include <cstddef>
#include <cstdint>

#include "data/image_codec.h"
#include "data/resized_crop.h"

namespace trainer {

// The decoded rows and columns that cover a crop, and where the crop lies inside them.
struct JpegRegion {
  DecodedImage image;  // [rows, columns, channels] of the DCT-scaled image around the crop
  CropBox crop;        // the crop in `image`'s pixels (the full-size crop scaled and rounded)
};

// Decodes the part of the JPEG `data` that covers `crop` (in full-size pixels) to `channels` (1 or
// 3) channels, at scale jpeg_scale_eighths(min_scale). Returns false, decoding nothing, for the
// images this path does not handle (CMYK and YCCK): the caller decodes those whole. Throws
// ImageDecodeError for a corrupt or truncated JPEG.
// read_to_end: decode the rows below the crop too (its columns only) and check the end of the data,
// so that damage anywhere in the scan is an error as in a whole decode (evaluation's guarantee).
bool decode_jpeg_region(const uint8_t* data, size_t size, int64_t channels, const CropBox& crop,
                        double min_scale, JpegRegion& out, bool read_to_end = false);

}  // namespace trainer
