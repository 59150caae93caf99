#pragma once
// The patch matrix of im2col_conv.cu, as code that runs on the host and the device: which value goes
// where, and which 16-byte pack a GPU thread writes. The kernel is a thin loop over these functions,
// so a CPU test (tests/nn/im2col_patches_test.cpp) checks the same arithmetic the GPU runs, pack by
// pack, against a direct reading of the convolution's windows.
//
// Rows are the N*OH*OW output pixels, columns (r, s, c) in the weight's channels-last order, k of them,
// zero-padded to kp (a multiple of 8: every row is whole 16-byte packs of 16-bit values).
#include <cstdint>

#if defined(__CUDACC__)
#define TRAINER_PATCH_FN __host__ __device__ __forceinline__
#else
#define TRAINER_PATCH_FN inline
#endif

namespace trainer::cuda {

inline constexpr int kPatchPack = 8;        // 16-bit values per 16-byte store
inline constexpr int kMaxTabledPacks = 32;  // kp <= 256: every pack's first column in the table

// Where a pack's first column starts in the window: its (r, s, c).
struct PackStart {
  uint8_t r, s, c;
};

struct Patches {
  int n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, k, kp;
  PackStart starts[kMaxTabledPacks];  // filled by fill_pack_starts when kp <= 8 * kMaxTabledPacks
  int64_t rows() const { return int64_t{n} * oh * ow; }
  int packs() const { return kp / kPatchPack; }
};

// The table of each pack's first (r, s, c), so a thread steps through its window without dividing.
inline void fill_pack_starts(Patches& g) {
  for (int j = 0; j < g.packs() && j < kMaxTabledPacks; ++j) {
    const int k0 = j * kPatchPack;
    g.starts[j] = {static_cast<uint8_t>(k0 / (g.c * g.kw)), static_cast<uint8_t>(k0 / g.c % g.kw),
                   static_cast<uint8_t>(k0 % g.c)};
  }
}

// Pack j of the row of output pixel (n, oh, ow), from a dense channels-last image of that sample:
// the values of x under the window (zero outside the image and past column k), as 16-bit patterns.
TRAINER_PATCH_FN void fill_pack(const Patches& g, const uint16_t* image, int oh, int ow, int j,
                                uint16_t out[kPatchPack]) {
  int r = g.starts[j].r, s = g.starts[j].s, c = g.starts[j].c;
  const int ih0 = oh * g.sh - g.ph, iw0 = ow * g.sw - g.pw, k0 = j * kPatchPack;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int e = 0; e < kPatchPack; ++e) {
    uint16_t v = 0;  // +0 in bf16 and f16
    const int ih = ih0 + r * g.dh, iw = iw0 + s * g.dw;
    if (k0 + e < g.k && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
      v = image[(static_cast<int64_t>(ih) * g.w + iw) * g.c + c];
    out[e] = v;
    if (++c == g.c) {
      c = 0;
      if (++s == g.kw) s = 0, ++r;
    }
  }
}

// The launch: blocks of packs x rows_per_block threads, threadIdx.x the pack and threadIdx.y the
// output column, so a block writes whole rows back to back (coalesced), and the grid's y is the output
// row (n, oh): no thread divides to find its pixel. Grid y is capped at 65535 and strided over.
struct PatchLaunch {
  int rows_per_block;
  unsigned grid_x, grid_y;
};
inline PatchLaunch patch_launch(const Patches& g, int threads = 256) {
  const int per_block = threads / g.packs() > 0 ? threads / g.packs() : 1;
  const int64_t out_rows = int64_t{g.n} * g.oh;
  return {per_block, static_cast<unsigned>((g.ow + per_block - 1) / per_block),
          static_cast<unsigned>(out_rows < 65535 ? out_rows : 65535)};
}

// The pixel and pack thread (tx, ty) of block (bx, by) writes, at output row `out_row` (by, then by +
// grid_y, ...): false where its column is past the image's width.
struct PackAt {
  int n, oh, ow, j;
  int64_t m;
};
TRAINER_PATCH_FN bool pack_at(const Patches& g, int rows_per_block, unsigned bx, int64_t out_row, unsigned tx,
                              unsigned ty, PackAt& at) {
  const int ow = static_cast<int>(bx) * rows_per_block + static_cast<int>(ty);
  if (ow >= g.ow) return false;
  const int row = static_cast<int>(out_row);  // N * OH fits in 31 bits (im2col_conv.cu's limits)
  at.n = row / g.oh;
  at.oh = row - at.n * g.oh;
  at.ow = ow;
  at.j = static_cast<int>(tx);
  at.m = out_row * g.ow + ow;
  return true;
}

}  // namespace trainer::cuda
