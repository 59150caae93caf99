#pragma once
// The geometric ops of AutoAugment, RandAugment and TrivialAugmentWide on one uint8 HWC image, with
// the semantics of torchvision.transforms.functional.affine / rotate on tensors (0.14): nearest
// neighbour, the area that falls outside the input filled with 0, the image's size kept, and the same
// pixel convention (coordinates of pixel centres relative to the image's centre, grid_sample with
// align_corners=False), computed in torchvision's float32 arithmetic so that the pixels picked are
// torchvision's, bit for bit. Not OpenCV's warpAffine: it rounds source coordinates half up in fixed
// point (1/1024 pixel), where torchvision rounds its float32 coordinate half to even, and a rotation by
// 30 degrees (sin = 0.5) puts whole rows and columns on exact halves: 1.1% of a 57x33 image's pixels
// took the other neighbour. The direct loop takes 340-470 us per 224x224x3 image on one core of the
// 2-core development machine (bench/augment_ops_bench); warpAffine was not timed against it.
#include <array>
#include <cstdint>
#include <vector>

#include "data/image_size.h"

namespace trainer {

// torchvision's inverse affine matrix (_get_inverse_affine_matrix): maps an output pixel's centred
// coordinates to the input's. Angles and shears in degrees, clockwise as torchvision's affine takes
// them; center in centred coordinates ((0, 0) = the image's centre).
std::array<double, 6> inverse_affine_matrix(double center_x, double center_y, double angle_degrees,
                                            double translate_x, double translate_y, double shear_x_degrees,
                                            double shear_y_degrees);

// Resamples hwc through `inverse` (centred coordinates, as above), nearest neighbour, fill 0. scratch
// is resized and reused.
void warp_affine_nearest(uint8_t* hwc, ImageSize size, const std::array<double, 6>& inverse,
                         std::vector<uint8_t>& scratch);

// The ops as torchvision's autoaugment._apply_op calls F.affine / F.rotate for a signed magnitude:
// shears by atan(magnitude) about the top-left corner; translations by int(magnitude) pixels
// (truncated toward zero); rotation by `degrees` counter-clockwise about the centre.
void shear_x(uint8_t* hwc, ImageSize size, double magnitude, std::vector<uint8_t>& scratch);
void shear_y(uint8_t* hwc, ImageSize size, double magnitude, std::vector<uint8_t>& scratch);
void translate_x(uint8_t* hwc, ImageSize size, double magnitude, std::vector<uint8_t>& scratch);
void translate_y(uint8_t* hwc, ImageSize size, double magnitude, std::vector<uint8_t>& scratch);
void rotate(uint8_t* hwc, ImageSize size, double degrees, std::vector<uint8_t>& scratch);

}  // namespace trainer
