#include "data/jpeg_region.h"

// jpeglib.h needs size_t and FILE declared before it.
#include <csetjmp>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace trainer {
namespace {

// libjpeg reports fatal errors through error_exit, which must not return: it jumps back to decode's
// setjmp. A warning means damaged scan data that libjpeg would paper over with wrong or grey pixels:
// it stops the decode too, as decode_image's TJFLAG_STOPONWARNING does, with the same messages.
struct ErrorManager {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<ErrorManager*>(cinfo->err);
  cinfo->err->format_message(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings about markers or trailing bytes, not pixels: garbage between the scan's end and the EOI
// marker ("N extraneous bytes before marker 0xd9", found in ImageNet's training set), an unknown
// JFIF revision, Adobe transform code or ICC marker. The pixels are whole; PIL and torchvision
// decode such files silently, and so does the trainer.
bool harmless(int code) {
  return code == JWRN_EXTRANEOUS_DATA || code == JWRN_JFIF_MAJOR || code == JWRN_ADOBE_XFORM ||
         code == JWRN_BOGUS_ICC;
}

void on_message(j_common_ptr cinfo, int level) {
  if (level >= 0 || harmless(cinfo->err->msg_code)) return;  // trace messages, harmless warnings
  on_error(cinfo);
}

// Row and column spans of the scaled image that a full-size crop covers, rounded as ImageFolder's
// scale_box rounds them.
struct Span {
  int64_t begin, end;
};
Span scaled_span(int64_t begin, int64_t length, int64_t full, int64_t scaled) {
  if (full == scaled) return {begin, begin + length};
  const double s = static_cast<double>(scaled) / static_cast<double>(full);
  const int64_t b = std::clamp<int64_t>(std::llround(static_cast<double>(begin) * s), 0, scaled - 1);
  const int64_t e = std::clamp<int64_t>(std::llround(static_cast<double>(begin + length) * s), b + 1, scaled);
  return {b, e};
}

// Everything libjpeg touches lives in the caller's frame or has a trivial destructor, so the longjmp
// of an error skips nothing that needs destroying. Returns "" or the
// problem; *unsupported is set (and nothing decoded) for CMYK / YCCK images.
// libjpeg's state, kept in the caller's frame: objects local to the function that calls setjmp and
// changed before the longjmp have indeterminate values after it (C's setjmp rules).
struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorManager errors;
};

std::string decode(Decompressor& d, const uint8_t* data, size_t size, int64_t channels, const CropBox& crop,
                   double min_scale, JpegRegion& out, bool read_to_end, bool* unsupported) {
  jpeg_decompress_struct& cinfo = d.cinfo;
  ErrorManager& errors = d.errors;
  cinfo.err = jpeg_std_error(&errors.base);
  errors.base.error_exit = on_error;
  errors.base.emit_message = on_message;
  errors.message[0] = '\0';
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    const std::string message = errors.message;
    if (message.find("Premature end") != std::string::npos)
      return "truncated JPEG: " + message + " (" + std::to_string(size) + " bytes)";
    return "corrupt JPEG: " + message;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    *unsupported = true;
    return "";
  }
  const int64_t full_height = cinfo.image_height, full_width = cinfo.image_width;
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  cinfo.scale_num = static_cast<unsigned>(jpeg_scale_eighths(min_scale));  // as decode_image
  cinfo.scale_denom = 8;
  jpeg_start_decompress(&cinfo);
  const int64_t height = cinfo.output_height, width = cinfo.output_width;
  const Span rows = scaled_span(crop.top, crop.height, full_height, height);
  const Span cols = scaled_span(crop.left, crop.width, full_width, width);
  // jpeg_crop_scanline widens the span to whole iMCUs: x_offset moves left, columns grows. At the
  // decoded region's edges fancy chroma upsampling replicates the edge column instead of reading
  // its neighbour, so one iMCU more on each side keeps the crop's own edge columns exact.
  const int64_t imcu_width = static_cast<int64_t>(cinfo.max_h_samp_factor) * cinfo.min_DCT_scaled_size;
  const int64_t first = std::max<int64_t>(0, cols.begin - imcu_width);
  JDIMENSION x_offset = static_cast<JDIMENSION>(first);
  JDIMENSION columns = static_cast<JDIMENSION>(std::min(width, cols.end + imcu_width) - first);
  if (columns < static_cast<JDIMENSION>(width)) jpeg_crop_scanline(&cinfo, &x_offset, &columns);
  if (rows.begin > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(rows.begin));
  const int64_t row_count = rows.end - rows.begin;
  const size_t stride = static_cast<size_t>(columns) * static_cast<size_t>(channels);
  out.image.width = columns;
  out.image.height = row_count;
  out.image.channels = channels;
  out.image.pixels.resize(stride * static_cast<size_t>(row_count));
  for (int64_t r = 0; r < row_count;) {
    JSAMPROW row = out.image.pixels.data() + static_cast<size_t>(r) * stride;
    r += jpeg_read_scanlines(&cinfo, &row, 1);
  }
  out.crop = {0, cols.begin - static_cast<int64_t>(x_offset), row_count, cols.end - cols.begin};
  if (read_to_end) {
    // jpeg_skip_scanlines to the end would not read the data at all: decode the rows, then the end.
    thread_local std::vector<uint8_t> scratch;
    scratch.resize(stride);
    JSAMPROW row = scratch.data();
    while (cinfo.output_scanline < cinfo.output_height) jpeg_read_scanlines(&cinfo, &row, 1);
    jpeg_finish_decompress(&cinfo);
  } else {
    // The rows below the crop are not needed: stop without reading them.
    jpeg_abort_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  return "";
}

}  // namespace

bool decode_jpeg_region(const uint8_t* data, size_t size, int64_t channels, const CropBox& crop,
                        double min_scale, JpegRegion& out, bool read_to_end) {
  if (channels != 1 && channels != 3)
    throw std::invalid_argument("decode_jpeg_region: channels must be 1 or 3, got " +
                                std::to_string(channels));
  bool unsupported = false;
  Decompressor decompressor;
  const std::string problem =
      decode(decompressor, data, size, channels, crop, min_scale, out, read_to_end, &unsupported);
  if (!problem.empty()) throw ImageDecodeError(problem);
  return !unsupported;
}

}  // namespace trainer
