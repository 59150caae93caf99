// nn/cuda/im2col_patches.h on the host: the GPU's im2col kernel is a loop over these functions, so
// running them here over the kernel's whole grid checks its arithmetic without a GPU. Every row and
// pack of the patch matrix is written exactly once, and each value is the input under the window (zero
// in the padding, past the image and past column k), for ResNet-50's and ResNet-18's stems, one
// channel, dilation, a non-square kernel with unequal strides, and a grid taller than 65,535 rows.
#include "nn/cuda/im2col_patches.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace trainer::cuda {
namespace {

Patches geometry(int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
  Patches g{};
  g.n = n, g.c = c, g.h = h, g.w = w, g.kh = kh, g.kw = kw, g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw;
  g.dh = dh, g.dw = dw;
  g.oh = (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1;
  g.ow = (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  g.k = kh * kw * c;
  g.kp = (g.k + kPatchPack - 1) / kPatchPack * kPatchPack;
  fill_pack_starts(g);
  return g;
}

// Column k of row (n, oh, ow), read straight from the convolution's definition.
uint16_t expected_value(const Patches& g, const std::vector<uint16_t>& x, int n, int oh, int ow, int k) {
  if (k >= g.k) return 0;
  const int r = k / (g.kw * g.c), s = k / g.c % g.kw, c = k % g.c;
  const int ih = oh * g.sh - g.ph + r * g.dh, iw = ow * g.sw - g.pw + s * g.dw;
  if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) return 0;
  return x[((static_cast<size_t>(n) * g.h + ih) * g.w + iw) * g.c + c];
}

// Runs the kernel's grid on the host, as im2col_nhwc_kernel does, and checks the result.
void check(const Patches& g, const std::string& what) {
  std::mt19937 rng(5);
  std::vector<uint16_t> x(static_cast<size_t>(g.n) * g.h * g.w * g.c);
  for (uint16_t& v : x) v = static_cast<uint16_t>(1 + rng() % 60000);  // never 0, so zeros are padding
  std::vector<uint16_t> cols(static_cast<size_t>(g.rows()) * g.kp, 0xFFFF);
  std::vector<int> writes(static_cast<size_t>(g.rows()) * g.packs(), 0);
  const PatchLaunch l = patch_launch(g);
  ASSERT_LE(g.packs() * l.rows_per_block, 256) << what;
  ASSERT_LE(l.grid_y, 65535u) << what;
  const int64_t out_rows = int64_t{g.n} * g.oh;
  for (unsigned by = 0; by < l.grid_y; ++by)
    for (unsigned bx = 0; bx < l.grid_x; ++bx)
      for (int64_t out_row = by; out_row < out_rows; out_row += l.grid_y)
        for (unsigned ty = 0; ty < static_cast<unsigned>(l.rows_per_block); ++ty)
          for (unsigned tx = 0; tx < static_cast<unsigned>(g.packs()); ++tx) {
            PackAt at{};
            if (!pack_at(g, l.rows_per_block, bx, out_row, tx, ty, at)) continue;
            ASSERT_EQ(at.m, (int64_t{at.n} * g.oh + at.oh) * g.ow + at.ow) << what;
            ++writes[static_cast<size_t>(at.m) * g.packs() + at.j];
            fill_pack(g, x.data() + static_cast<size_t>(at.n) * g.h * g.w * g.c, at.oh, at.ow, at.j,
                      cols.data() + at.m * g.kp + at.j * kPatchPack);
          }
  for (size_t i = 0; i < writes.size(); ++i) ASSERT_EQ(writes[i], 1) << what << ": pack " << i;
  int bad = 0;
  for (int n = 0; n < g.n; ++n)
    for (int oh = 0; oh < g.oh; ++oh)
      for (int ow = 0; ow < g.ow; ++ow)
        for (int k = 0; k < g.kp; ++k) {
          const int64_t m = (int64_t{n} * g.oh + oh) * g.ow + ow;
          if (cols[static_cast<size_t>(m) * g.kp + k] != expected_value(g, x, n, oh, ow, k) && ++bad <= 5)
            ADD_FAILURE() << what << ": row " << m << " column " << k;
        }
  EXPECT_EQ(bad, 0) << what;
}

TEST(Im2colPatches, EveryPackOnceAndEveryValueFromItsWindow) {
  check(geometry(2, 3, 32, 30, 7, 7, 2, 2, 3, 3, 1, 1), "ResNet-50's stem (k 147, kp 152)");
  check(geometry(3, 3, 17, 19, 3, 3, 1, 1, 1, 1, 1, 1), "ResNet-18-cifar's stem (k 27)");
  check(geometry(2, 1, 28, 28, 3, 3, 1, 1, 1, 1, 1, 1), "Fashion-MNIST's stem (k 9)");
  check(geometry(2, 4, 15, 15, 3, 3, 1, 1, 2, 2, 2, 2), "dilation 2 (k 36)");
  check(geometry(2, 2, 11, 9, 5, 3, 2, 1, 2, 1, 1, 1), "5x3 kernel, strides 2 and 1");
  check(geometry(1, 4, 9, 9, 8, 8, 1, 1, 3, 3, 1, 1), "k 256, the largest the table holds");
}

TEST(Im2colPatches, AGridTallerThanItsLimitStridesOverTheRows) {
  // 700 samples x 100 output rows = 70,000 grid rows: blockIdx.y is capped at 65,535.
  const Patches g = geometry(700, 1, 100, 2, 1, 1, 1, 1, 0, 0, 1, 1);
  ASSERT_EQ(patch_launch(g).grid_y, 65535u);
  check(g, "70,000 output rows");
}

}  // namespace
}  // namespace trainer::cuda
