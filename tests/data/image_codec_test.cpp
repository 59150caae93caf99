#include "data/image_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/error_of.h"

namespace trainer {
namespace {

// A smooth gradient, which JPEG keeps close to the original.
std::vector<uint8_t> gradient(int64_t width, int64_t height, int64_t channels) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * channels));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < channels; ++c)
        pixels[static_cast<size_t>((y * width + x) * channels + c)] =
            static_cast<uint8_t>(40 + 2 * x + 3 * y + 30 * c);
  return pixels;
}

// Noise, so that JPEG's entropy-coded data is most of the file and a cut lands in it.
std::vector<uint8_t> noise(size_t bytes) {
  std::vector<uint8_t> pixels(bytes);
  uint64_t state = 7;
  for (uint8_t& p : pixels) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    p = static_cast<uint8_t>(state >> 56);
  }
  return pixels;
}

int max_abs_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

TEST(ImageCodec, FormatIsToldByMagicBytes) {
  const std::vector<uint8_t> rgb = gradient(8, 6, 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), 8, 6, 3);
  const std::vector<uint8_t> png = encode_png(rgb.data(), 8, 6, 3);
  EXPECT_EQ(sniff_image_format(jpeg.data(), jpeg.size()), ImageFormat::jpeg);
  EXPECT_EQ(sniff_image_format(png.data(), png.size()), ImageFormat::png);
  EXPECT_EQ(sniff_image_format(rgb.data(), rgb.size()), ImageFormat::unknown);
  const ImageInfo info = read_image_info(png.data(), png.size());
  EXPECT_EQ(info.format, ImageFormat::png);
  EXPECT_EQ(info.width, 8);
  EXPECT_EQ(info.height, 6);
  EXPECT_EQ(read_image_info(jpeg.data(), jpeg.size()).width, 8);
}

TEST(ImageCodec, PngRoundTripsExactlyAndConvertsChannelsLikePil) {
  const std::vector<uint8_t> rgb = gradient(7, 5, 3);
  DecodedImage out;
  const std::vector<uint8_t> png = encode_png(rgb.data(), 7, 5, 3);
  decode_image(png.data(), png.size(), 3, out);
  EXPECT_EQ(out.width, 7);
  EXPECT_EQ(out.height, 5);
  EXPECT_EQ(out.channels, 3);
  EXPECT_EQ(out.pixels, rgb);

  // RGB -> L with PIL's ITU-R 601-2 weights.
  decode_image(png.data(), png.size(), 1, out);
  ASSERT_EQ(out.pixels.size(), 35u);
  const int r = rgb[0], g = rgb[1], b = rgb[2];
  EXPECT_EQ(out.pixels[0], (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);

  // Grey is replicated; alpha is dropped.
  const std::vector<uint8_t> grey = gradient(7, 5, 1);
  const std::vector<uint8_t> grey_png = encode_png(grey.data(), 7, 5, 1);
  decode_image(grey_png.data(), grey_png.size(), 3, out);
  for (size_t p = 0; p < grey.size(); ++p) {
    ASSERT_EQ(out.pixels[3 * p], grey[p]);
    ASSERT_EQ(out.pixels[3 * p + 1], grey[p]);
    ASSERT_EQ(out.pixels[3 * p + 2], grey[p]);
  }
  decode_image(grey_png.data(), grey_png.size(), 1, out);
  EXPECT_EQ(out.pixels, grey);
  const std::vector<uint8_t> rgba = gradient(7, 5, 4);
  const std::vector<uint8_t> rgba_png = encode_png(rgba.data(), 7, 5, 4);
  decode_image(rgba_png.data(), rgba_png.size(), 3, out);
  for (size_t p = 0; p < 35; ++p)
    for (size_t c = 0; c < 3; ++c) ASSERT_EQ(out.pixels[3 * p + c], rgba[4 * p + c]);
  const std::vector<uint8_t> grey_alpha = gradient(7, 5, 2);
  const std::vector<uint8_t> grey_alpha_png = encode_png(grey_alpha.data(), 7, 5, 2);
  decode_image(grey_alpha_png.data(), grey_alpha_png.size(), 1, out);
  for (size_t p = 0; p < 35; ++p) ASSERT_EQ(out.pixels[p], grey_alpha[2 * p]);
}

TEST(ImageCodec, JpegRoundTripsCloselyInRgbAndGrey) {
  const std::vector<uint8_t> rgb = gradient(24, 16, 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), 24, 16, 3, 100);
  DecodedImage out;
  decode_image(jpeg.data(), jpeg.size(), 3, out);
  EXPECT_EQ(out.width, 24);
  EXPECT_EQ(out.height, 16);
  EXPECT_LE(max_abs_difference(out.pixels, rgb), 3);

  const std::vector<uint8_t> grey = gradient(24, 16, 1);
  const std::vector<uint8_t> grey_jpeg = encode_jpeg(grey.data(), 24, 16, 1, 100);
  decode_image(grey_jpeg.data(), grey_jpeg.size(), 1, out);
  EXPECT_LE(max_abs_difference(out.pixels, grey), 2);
  decode_image(grey_jpeg.data(), grey_jpeg.size(), 3, out);  // grey JPEG to RGB: equal channels
  ASSERT_EQ(out.pixels.size(), grey.size() * 3);
  for (size_t p = 0; p < grey.size(); ++p) {
    EXPECT_EQ(out.pixels[3 * p], out.pixels[3 * p + 1]);
    EXPECT_EQ(out.pixels[3 * p], out.pixels[3 * p + 2]);
  }
}

// Only the scales with libjpeg-turbo's fast inverse DCTs: 1/8, 2/8, 4/8, 8/8 (jpeg_scale_eighths).
TEST(ImageCodec, JpegDecodesAtTheSmallestFastDctScaleAboveTheMinimum) {
  const std::vector<uint8_t> rgb = gradient(64, 48, 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), 64, 48, 3);
  DecodedImage out;
  for (const auto& [min_scale, width, height] :
       {std::tuple{1.0, 64, 48}, std::tuple{0.9, 64, 48}, std::tuple{0.6, 64, 48}, std::tuple{0.5, 32, 24},
        std::tuple{0.3, 32, 24}, std::tuple{0.25, 16, 12}, std::tuple{0.2, 16, 12}, std::tuple{0.125, 8, 6},
        std::tuple{0.01, 8, 6}}) {
    decode_image(jpeg.data(), jpeg.size(), 3, out, min_scale);
    EXPECT_EQ(out.width, width) << min_scale;
    EXPECT_EQ(out.height, height) << min_scale;
    EXPECT_EQ(out.pixels.size(), static_cast<size_t>(width * height * 3));
  }
  const std::vector<uint8_t> png = encode_png(rgb.data(), 64, 48, 3);
  decode_image(png.data(), png.size(), 3, out, 0.25);  // PNG: always full size
  EXPECT_EQ(out.width, 64);
}

TEST(ImageCodec, BrokenImagesSayWhatIsWrong) {
  const std::vector<uint8_t> rgb = noise(32 * 32 * 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), 32, 32, 3);
  const std::vector<uint8_t> png = encode_png(rgb.data(), 32, 32, 3);
  DecodedImage out;
  const auto decode = [&](std::vector<uint8_t> bytes) {
    return testing::error_of<ImageDecodeError>([&] { decode_image(bytes.data(), bytes.size(), 3, out); });
  };
  EXPECT_NE(
      decode({jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() * 2 / 3)}).find("truncated JPEG"),
      std::string::npos);
  EXPECT_NE(decode({jpeg.begin(), jpeg.begin() + 10}).find("truncated or corrupt JPEG header"),
            std::string::npos);
  EXPECT_NE(decode({jpeg.begin(), jpeg.begin() + 200}).find("truncated or corrupt JPEG header"),
            std::string::npos);
  const std::string cut_png = decode({png.begin(), png.begin() + static_cast<long>(png.size() / 2)});
  EXPECT_TRUE(cut_png.find("truncated PNG") != std::string::npos ||
              cut_png.find("corrupt PNG") != std::string::npos)
      << cut_png;
  std::vector<uint8_t> bad_crc = png;
  bad_crc[20] ^= 0xff;  // inside IHDR: its CRC no longer matches
  EXPECT_NE(decode(bad_crc).find("PNG"), std::string::npos);
  EXPECT_EQ(decode({'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}),
            "not a JPEG or PNG image (it starts with bytes 68 65 6c 6c 6f 20 77 6f)");
  EXPECT_EQ(decode({'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0}),
            "a GIF image: only JPEG and PNG are supported");
  EXPECT_EQ(decode({1, 2, 3}), "3 bytes: too short to be an image");
  EXPECT_EQ(decode({}), "an empty file, not an image");
}

// ---- damaged pixel data (issue 30): every checksum a file carries is checked, and damage the decoder
// only warns about is an error, so data.bad_samples = "error" stops on it instead of training on it.

uint32_t read_be32(const std::vector<uint8_t>& bytes, size_t at) {
  return uint32_t{bytes[at]} << 24 | uint32_t{bytes[at + 1]} << 16 | uint32_t{bytes[at + 2]} << 8 |
         bytes[at + 3];
}

void write_be32(std::vector<uint8_t>& bytes, size_t at, uint32_t value) {
  for (int k = 0; k < 4; ++k)
    bytes[at + static_cast<size_t>(k)] = static_cast<uint8_t>(value >> (24 - 8 * k));
}

// The CRC-32 of PNG chunks (ISO 3309, reflected polynomial 0xedb88320), bit by bit.
uint32_t png_crc(const uint8_t* data, size_t size) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xffffffffu;
}

struct PngChunk {
  size_t start = 0;  // of its length field
  size_t length = 0;
  size_t data() const { return start + 8; }
  size_t crc() const { return data() + length; }
};

PngChunk find_chunk(const std::vector<uint8_t>& png, const char* type) {
  for (size_t at = 8; at + 12 <= png.size();) {
    const PngChunk chunk{at, read_be32(png, at)};
    if (std::equal(type, type + 4, png.begin() + static_cast<long>(at + 4))) return chunk;
    at = chunk.crc() + 4;
  }
  ADD_FAILURE() << "no " << type << " chunk";
  return {};
}

void fix_crc(std::vector<uint8_t>& png, const PngChunk& chunk) {
  write_be32(png, chunk.crc(), png_crc(png.data() + chunk.start + 4, chunk.length + 4));
}

TEST(ImageCodecDamage, PngWithABadIdatCrcIsCorrupt) {
  const std::vector<uint8_t> rgb = noise(32 * 32 * 3);
  std::vector<uint8_t> png = encode_png(rgb.data(), 32, 32, 3);
  const PngChunk idat = find_chunk(png, "IDAT");
  png[idat.crc()] ^= 0x01;
  DecodedImage out;
  const std::string error =
      testing::error_of<ImageDecodeError>([&] { decode_image(png.data(), png.size(), 3, out); });
  EXPECT_NE(error.find("corrupt PNG"), std::string::npos) << error;
}

TEST(ImageCodecDamage, PngWhoseCompressedDataFailsItsZlibChecksumIsCorrupt) {
  const std::vector<uint8_t> rgb = gradient(100, 100, 3);
  const std::vector<uint8_t> png = encode_png(rgb.data(), 100, 100, 3);
  const PngChunk idat = find_chunk(png, "IDAT");
  DecodedImage out;
  // The zlib stream's last 4 bytes are the Adler-32 of the pixels: a wrong one, under a valid chunk CRC.
  std::vector<uint8_t> bad_adler = png;
  bad_adler[idat.crc() - 1] ^= 0x01;
  fix_crc(bad_adler, idat);
  std::string error =
      testing::error_of<ImageDecodeError>([&] { decode_image(bad_adler.data(), bad_adler.size(), 3, out); });
  EXPECT_NE(error.find("corrupt PNG"), std::string::npos) << error;
  // One bit flipped in the compressed bytes, the chunk CRC made to match: the image fails to decode or
  // decodes to the original pixels (a flip inflate never reads), never to other pixels. Before the
  // fix, libspng stopped reading at the last scanline and missed most such flips in this image.
  int detected = 0;
  for (size_t at = idat.data() + 2; at < idat.crc(); at += 7) {
    std::vector<uint8_t> damaged = png;
    damaged[at] ^= 0x04;
    fix_crc(damaged, idat);
    error =
        testing::error_of<ImageDecodeError>([&] { decode_image(damaged.data(), damaged.size(), 3, out); });
    if (!error.empty()) {
      EXPECT_NE(error.find("PNG"), std::string::npos) << error;
      ++detected;
      continue;
    }
    EXPECT_EQ(out.pixels, rgb) << "a flip at byte " << at << " decoded to other pixels without an error";
  }
  EXPECT_GT(detected, 0);
}

TEST(ImageCodecDamage, JpegWithDamagedScanDataIsCorrupt) {
  const std::vector<uint8_t> rgb = noise(32 * 32 * 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), 32, 32, 3);
  // libjpeg recovers from this with a warning ("Corrupt JPEG data: ...") and partly wrong pixels.
  std::vector<uint8_t> garbled = jpeg;
  for (size_t i = garbled.size() / 2; i < garbled.size() / 2 + 64; ++i) garbled[i] = 0xff;
  DecodedImage out;
  for (const double min_scale : {1.0, 0.25}) {
    const std::string error = testing::error_of<ImageDecodeError>(
        [&] { decode_image(garbled.data(), garbled.size(), 3, out, min_scale); });
    EXPECT_EQ(error.rfind("corrupt JPEG: ", 0), 0u) << error;
  }
  // The decompressor that warned decodes the next, good image.
  EXPECT_NO_THROW(decode_image(jpeg.data(), jpeg.size(), 3, out));
}

TEST(ImageCodec, AGoodJpegDecodesAfterABrokenOneOnTheSameThread) {
  // libjpeg-turbo 2.1 leaves a decompressor that failed on a header cut short failing the next image.
  const std::vector<uint8_t> rgb = noise(40 * 40 * 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(rgb.data(), 40, 40, 3);
  DecodedImage out;
  for (const size_t cut : {size_t{10}, size_t{200}, jpeg.size() / 2, size_t{3}}) {
    EXPECT_THROW(decode_image(jpeg.data(), cut, 3, out), ImageDecodeError) << cut;
    EXPECT_NO_THROW(read_image_info(jpeg.data(), jpeg.size())) << cut;
    if (cut < 300) EXPECT_THROW(read_image_info(jpeg.data(), cut), ImageDecodeError) << cut;  // in the header
    EXPECT_NO_THROW(decode_image(jpeg.data(), jpeg.size(), 3, out)) << cut;
    EXPECT_EQ(out.width, 40);
  }
}

}  // namespace
}  // namespace trainer
