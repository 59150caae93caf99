#include "data/image_codec.h"

#include <spng.h>
#include <turbojpeg.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "data/jpeg_region.h"
#include "data/png_integrity.h"

namespace trainer {

namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

[[noreturn]] void fail(const std::string& problem) { throw ImageDecodeError(problem); }

// What a file that is neither JPEG nor PNG looks like, for the error message.
std::string describe_unknown(const uint8_t* data, size_t size) {
  if (size == 0) return "an empty file, not an image";
  if (size < 8) return std::to_string(size) + " bytes: too short to be an image";
  const auto starts_with = [&](const char* magic) {
    return std::memcmp(data, magic, std::strlen(magic)) == 0;
  };
  std::string kind;
  if (starts_with("GIF8")) kind = "a GIF image";
  if (starts_with("BM")) kind = "a BMP image";
  if (std::memcmp(data, "II*\0", 4) == 0 || std::memcmp(data, "MM\0*", 4) == 0) kind = "a TIFF image";
  if (size >= 12 && starts_with("RIFF") && std::memcmp(data + 8, "WEBP", 4) == 0) kind = "a WebP image";
  if (!kind.empty()) return kind + ": only JPEG and PNG are supported";
  char hex[3 * 8 + 1] = {};
  for (size_t i = 0; i < 8; ++i) std::snprintf(hex + 3 * i, 4, "%02x ", data[i]);
  return std::string("not a JPEG or PNG image (it starts with bytes ") + std::string(hex, 3 * 8 - 1) + ")";
}

void check_pixel_count(int64_t width, int64_t height, const char* format) {
  if (width <= 0 || height <= 0 || width * height > kMaxImagePixels) {
    fail(std::string(format) + " header says " + std::to_string(width) + "x" + std::to_string(height) +
         " pixels: corrupt, or over the " + std::to_string(kMaxImagePixels) + "-pixel limit");
  }
}

// ---- JPEG

// One TurboJPEG instance per thread: creating one costs allocations, and an instance must not be
// used by two threads at once.
struct TjInstance {
  explicit TjInstance(bool compress) : handle(compress ? tjInitCompress() : tjInitDecompress()) {}
  ~TjInstance() {
    if (handle) tjDestroy(handle);
  }
  TjInstance(const TjInstance&) = delete;
  TjInstance& operator=(const TjInstance&) = delete;
  tjhandle handle;
};

thread_local std::unique_ptr<TjInstance> decompressor;

tjhandle thread_decompressor() {
  if (!decompressor) decompressor = std::make_unique<TjInstance>(false);
  if (!decompressor->handle) {
    decompressor.reset();
    throw DataError(std::string("TurboJPEG: cannot create a decompressor: ") + tjGetErrorStr2(nullptr));
  }
  return decompressor->handle;
}

// After an error, libjpeg-turbo 2.1's decompressor can fail the next, valid image with the same
// error ("missing SOS marker" after a header cut short): the next image gets a fresh one.
[[noreturn]] void fail_and_discard_decompressor(const std::string& problem) {
  decompressor.reset();
  fail(problem);
}

struct JpegHeader {
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
};

JpegHeader read_jpeg_header(tjhandle tj, const uint8_t* data, size_t size) {
  JpegHeader h;
  // A header cut short can "succeed" with a warning and no frame: its size stays 0.
  if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(size), &h.width, &h.height, &h.subsampling,
                          &h.colorspace) != 0 ||
      h.width <= 0 || h.height <= 0) {
    fail_and_discard_decompressor(std::string("truncated or corrupt JPEG header: ") + tjGetErrorStr2(tj) +
                                  " (" + std::to_string(size) + " bytes)");
  }
  check_pixel_count(h.width, h.height, "JPEG");
  return h;
}

tjscalingfactor choose_scaling(double min_scale) { return {jpeg_scale_eighths(min_scale), 8}; }

uint8_t luma(uint8_t r, uint8_t g, uint8_t b) {
  // PIL's RGB -> L: ITU-R 601-2 weights in 16-bit fixed point, rounded.
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

void decode_jpeg(const uint8_t* data, size_t size, int64_t channels, DecodedImage& out, double min_scale) {
  tjhandle tj = thread_decompressor();
  const JpegHeader header = read_jpeg_header(tj, data, size);
  // Through libjpeg's own API (data/jpeg_region.cpp), which tells warnings about damaged pixels from
  // harmless ones by their code, where TurboJPEG only stops at the first of either. The same
  // decoder, scale and IDCT: the pixels are TurboJPEG's. TurboJPEG below for CMYK and YCCK only.
  thread_local JpegRegion whole;
  if (decode_jpeg_region(data, size, channels, CropBox{0, 0, header.height, header.width}, min_scale, whole,
                         /*read_to_end=*/true)) {
    out.width = whole.image.width;
    out.height = whole.image.height;
    out.channels = channels;
    out.pixels.swap(whole.image.pixels);
    return;
  }
  const tjscalingfactor factor = choose_scaling(min_scale);
  const int width = TJSCALED(header.width, factor);
  const int height = TJSCALED(header.height, factor);
  // libjpeg converts CMYK/YCCK to CMYK only: those are converted to RGB here.
  const bool cmyk = header.colorspace == TJCS_CMYK || header.colorspace == TJCS_YCCK;
  const int pixel_format = cmyk ? TJPF_CMYK : channels == 1 ? TJPF_GRAY : TJPF_RGB;
  thread_local std::vector<uint8_t> cmyk_pixels;
  out.width = width;
  out.height = height;
  out.channels = channels;
  out.pixels.resize(static_cast<size_t>(width) * height * channels);
  uint8_t* target = out.pixels.data();
  if (cmyk) {
    cmyk_pixels.resize(static_cast<size_t>(width) * height * 4);
    target = cmyk_pixels.data();
  }
  // A warning ("Corrupt JPEG data: ...", "Premature end of JPEG file") means damaged scan data that
  // libjpeg papers over with wrong or grey pixels: an error, like the failures, so that
  // bad_samples = "error" stops on it (issue 30). TJFLAG_STOPONWARNING stops at the first one.
  if (tjDecompress2(tj, data, static_cast<unsigned long>(size), target, width, 0, height, pixel_format,
                    TJFLAG_STOPONWARNING) != 0) {
    const std::string message = tjGetErrorStr2(tj);
    decompressor.reset();
    if (message.find("Premature end") != std::string::npos) {
      fail("truncated JPEG: " + message + " (" + std::to_string(size) + " bytes)");
    }
    fail("corrupt JPEG: " + message);
  }
  if (cmyk) {
    // Adobe's (the usual) CMYK JPEGs store inverted ink values: R = C * K / 255 on the stored bytes,
    // which is PIL's conversion after it undoes the inversion.
    const size_t pixels = static_cast<size_t>(width) * height;
    for (size_t p = 0; p < pixels; ++p) {
      const uint8_t* in = cmyk_pixels.data() + 4 * p;
      const uint8_t r = static_cast<uint8_t>((in[0] * in[3] + 127) / 255);
      const uint8_t g = static_cast<uint8_t>((in[1] * in[3] + 127) / 255);
      const uint8_t b = static_cast<uint8_t>((in[2] * in[3] + 127) / 255);
      if (channels == 1) {
        out.pixels[p] = luma(r, g, b);
      } else {
        out.pixels[3 * p + 0] = r;
        out.pixels[3 * p + 1] = g;
        out.pixels[3 * p + 2] = b;
      }
    }
  }
}

// ---- PNG

struct SpngContextDeleter {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};
using SpngContext = std::unique_ptr<spng_ctx, SpngContextDeleter>;

SpngContext open_png(const uint8_t* data, size_t size, spng_ihdr& ihdr) {
  SpngContext ctx(spng_ctx_new(0));
  if (!ctx) throw DataError("spng: cannot create a decoder context");
  int rc = spng_set_png_buffer(ctx.get(), data, size);
  if (rc == SPNG_OK) rc = spng_get_ihdr(ctx.get(), &ihdr);
  if (rc != SPNG_OK) {
    fail(std::string("truncated or corrupt PNG header: ") + spng_strerror(rc) + " (" + std::to_string(size) +
         " bytes)");
  }
  check_pixel_count(ihdr.width, ihdr.height, "PNG");
  return ctx;
}

void decode_png(const uint8_t* data, size_t size, int64_t channels, DecodedImage& out) {
  spng_ihdr ihdr{};
  SpngContext ctx = open_png(data, size, ihdr);
  check_png_integrity(data, size);  // what libspng leaves unchecked (data/png_integrity.h)
  // RGBA8 covers every colour type and bit depth (palette, grey, 16 bits); alpha is then dropped.
  thread_local std::vector<uint8_t> rgba;
  size_t bytes = 0;
  int rc = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGBA8, &bytes);
  if (rc == SPNG_OK) {
    rgba.resize(bytes);
    rc = spng_decode_image(ctx.get(), rgba.data(), bytes, SPNG_FMT_RGBA8, 0);
  }
  if (rc != SPNG_OK) {
    fail(std::string(rc == SPNG_EOF ? "truncated PNG: " : "corrupt PNG: ") + spng_strerror(rc) + " (" +
         std::to_string(size) + " bytes)");
  }
  out.width = ihdr.width;
  out.height = ihdr.height;
  out.channels = channels;
  const size_t pixels = static_cast<size_t>(ihdr.width) * ihdr.height;
  out.pixels.resize(pixels * channels);
  for (size_t p = 0; p < pixels; ++p) {
    const uint8_t* in = rgba.data() + 4 * p;
    if (channels == 1) {
      out.pixels[p] = luma(in[0], in[1], in[2]);
    } else {
      std::memcpy(out.pixels.data() + 3 * p, in, 3);
    }
  }
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::jpeg;
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0) return ImageFormat::png;
  return ImageFormat::unknown;
}

const char* to_string(ImageFormat format) {
  switch (format) {
    case ImageFormat::jpeg:
      return "JPEG";
    case ImageFormat::png:
      return "PNG";
    default:
      return "unknown";
  }
}

ImageInfo read_image_info(const uint8_t* data, size_t size) {
  const ImageFormat format = sniff_image_format(data, size);
  if (format == ImageFormat::jpeg) {
    const JpegHeader header = read_jpeg_header(thread_decompressor(), data, size);
    return {format, header.width, header.height};
  }
  if (format == ImageFormat::png) {
    spng_ihdr ihdr{};
    open_png(data, size, ihdr);
    return {format, ihdr.width, ihdr.height};
  }
  fail(describe_unknown(data, size));
}

int jpeg_scale_eighths(double min_scale) {
  for (const int n : {1, 2, 4})
    if (static_cast<double>(n) / 8.0 >= min_scale) return n;
  return 8;
}

void decode_image(const uint8_t* data, size_t size, int64_t channels, DecodedImage& out, double min_scale) {
  if (channels != 1 && channels != 3) {
    throw DataError("decode_image: channels must be 1 or 3, got " + std::to_string(channels));
  }
  switch (sniff_image_format(data, size)) {
    case ImageFormat::jpeg:
      return decode_jpeg(data, size, channels, out, min_scale);
    case ImageFormat::png:
      return decode_png(data, size, channels, out);
    default:
      fail(describe_unknown(data, size));
  }
}

std::vector<uint8_t> encode_jpeg(const uint8_t* hwc, int64_t width, int64_t height, int64_t channels,
                                 int quality) {
  if (channels != 1 && channels != 3) {
    throw DataError("encode_jpeg: channels must be 1 or 3, got " + std::to_string(channels));
  }
  TjInstance compressor(true);
  if (!compressor.handle)
    throw DataError(std::string("TurboJPEG: cannot create a compressor: ") + tjGetErrorStr2(nullptr));
  unsigned char* jpeg = nullptr;
  unsigned long jpeg_size = 0;
  const int rc = tjCompress2(compressor.handle, hwc, static_cast<int>(width), 0, static_cast<int>(height),
                             channels == 1 ? TJPF_GRAY : TJPF_RGB, &jpeg, &jpeg_size,
                             channels == 1 ? TJSAMP_GRAY : TJSAMP_444, quality, TJFLAG_ACCURATEDCT);
  if (rc != 0) {
    const std::string message = tjGetErrorStr2(compressor.handle);
    tjFree(jpeg);
    throw DataError("encode_jpeg: " + message);
  }
  std::vector<uint8_t> bytes(jpeg, jpeg + jpeg_size);
  tjFree(jpeg);
  return bytes;
}

std::vector<uint8_t> encode_png(const uint8_t* hwc, int64_t width, int64_t height, int64_t channels) {
  static constexpr uint8_t kColorTypes[] = {SPNG_COLOR_TYPE_GRAYSCALE, SPNG_COLOR_TYPE_GRAYSCALE_ALPHA,
                                            SPNG_COLOR_TYPE_TRUECOLOR, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA};
  if (channels < 1 || channels > 4) {
    throw DataError("encode_png: channels must be 1 to 4, got " + std::to_string(channels));
  }
  SpngContext ctx(spng_ctx_new(SPNG_CTX_ENCODER));
  if (!ctx) throw DataError("spng: cannot create an encoder context");
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(width);
  ihdr.height = static_cast<uint32_t>(height);
  ihdr.bit_depth = 8;
  ihdr.color_type = kColorTypes[channels - 1];
  int rc = spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  if (rc == SPNG_OK) rc = spng_set_ihdr(ctx.get(), &ihdr);
  if (rc == SPNG_OK) {
    rc = spng_encode_image(ctx.get(), hwc, static_cast<size_t>(width * height * channels), SPNG_FMT_PNG,
                           SPNG_ENCODE_FINALIZE);
  }
  if (rc != SPNG_OK) throw DataError(std::string("encode_png: ") + spng_strerror(rc));
  size_t size = 0;
  void* png = spng_get_png_buffer(ctx.get(), &size, &rc);
  if (!png) throw DataError(std::string("encode_png: ") + spng_strerror(rc));
  std::vector<uint8_t> bytes(static_cast<uint8_t*>(png), static_cast<uint8_t*>(png) + size);
  std::free(png);
  return bytes;
}

}  // namespace trainer
