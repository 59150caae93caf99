#pragma once
// The checks a PNG file carries, done in full before its pixels are used: the CRC-32 of every critical
// chunk (IHDR, PLTE, IDAT, IEND) and the zlib stream of the IDAT chunks inflated to its end, which checks
// its Adler-32. libspng 0.7 checks neither completely: it reads IDAT only as far as the last scanline
// needs, so a bad CRC of the last IDAT chunk, or damaged compressed bytes that still inflate to enough
// bytes, decode without an error to wrong pixels (issue 30).
#include <cstddef>
#include <cstdint>

namespace trainer {

// Throws ImageDecodeError ("corrupt PNG: ..." or "truncated PNG: ...") when a check fails. Costs one
// more inflate of the pixel data. `data` must start with the PNG signature.
void check_png_integrity(const uint8_t* data, size_t size);

}  // namespace trainer
