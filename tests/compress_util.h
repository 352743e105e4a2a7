#pragma once

// Compressed files for the tests of lamp's text readers: a gzip member with
// zlib, and a zstd frame with libzstd where lamp reads zstd
// (LAMP_TEST_EXPECT_ZSTD).

#include <gtest/gtest.h>
#include <zlib.h>

#include <string>

#if LAMP_TEST_EXPECT_ZSTD
#include <zstd.h>
#endif

namespace lamp_test {

/// One gzip member of `text`, as gzip(1) writes it.
inline std::string gzip(const std::string& text) {
  z_stream stream{};
  // 15 + 16: a gzip header and trailer, not zlib's.
  EXPECT_EQ(
      deflateInit2(&stream, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY),
      Z_OK);
  std::string out(deflateBound(&stream, static_cast<uLong>(text.size())), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  stream.avail_in = static_cast<uInt>(text.size());
  stream.next_out = reinterpret_cast<Bytef*>(&out[0]);
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

#if LAMP_TEST_EXPECT_ZSTD
/// One zstd frame of `text`, as zstd(1) writes it (its size in its header).
inline std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n =
      ZSTD_compress(&out[0], out.size(), text.data(), text.size(), 3);
  EXPECT_EQ(ZSTD_isError(n), 0u);
  out.resize(n);
  return out;
}

/// One zstd frame of `text` written as a stream, without its size in its
/// header (as `zstd` writes what it reads from a pipe).
inline std::string zstd_streamed(const std::string& text) {
  ZSTD_CCtx* context = ZSTD_createCCtx();
  std::string out(ZSTD_compressBound(text.size()) + 64, '\0');
  ZSTD_outBuffer sink{&out[0], out.size(), 0};
  // The first half given as it would come from a pipe, then the rest: the
  // size is not known when the header is written.
  ZSTD_inBuffer first{text.data(), text.size() / 2, 0};
  EXPECT_EQ(ZSTD_isError(
                ZSTD_compressStream2(context, &sink, &first, ZSTD_e_continue)),
            0u);
  ZSTD_inBuffer in{text.data() + first.pos, text.size() - first.pos, 0};
  EXPECT_EQ(ZSTD_compressStream2(context, &sink, &in, ZSTD_e_end), 0u);
  ZSTD_freeCCtx(context);
  out.resize(sink.pos);
  return out;
}
#endif

} // namespace lamp_test
