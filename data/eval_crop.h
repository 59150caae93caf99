#pragma once
// torchvision's evaluation geometry on an encoded image: Resize(resize) of the shorter side, then
// CenterCrop(crop), into crop x crop x channels uint8 pixels. The image-folder dataset's evaluation
// samples (data/image_folder.h) and `trainer predict`'s files both come from here, so a picture is
// classified from the same pixels either way. Of a JPEG only the centre crop's columns are decoded,
// at a reduced DCT scale when it is shrunk anyway.
#include <cstddef>
#include <cstdint>

namespace trainer {

// resize >= crop >= 1; channels 1 or 3. Throws ImageDecodeError (data/image_codec.h) for an image that
// does not decode, std::invalid_argument for bad sizes.
void decode_eval_crop(const uint8_t* data, size_t size, int64_t channels, int64_t resize, int64_t crop,
                      uint8_t* hwc_out);

}  // namespace trainer
