#pragma once

// Text files read a block or a line at a time, decompressed where they are
// gzip (zlib) or zstd (libzstd, where lamp was built with it) files
// (internal). Corpora come compressed (C4 and Dolma as .json.gz, The Pile and
// SlimPajama as .jsonl.zst): the text readers take them as they are, known by
// their first bytes, not by their names.

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace lamp {
namespace data {
namespace internal {

enum class Compression { kNone, kGzip, kZstd };

// Whether this lamp reads zstd files (built with libzstd).
bool zstd_available();

// A file's compression, from its first bytes (`head`, `size` of them):
// gzip (1f 8b) or zstd (28 b5 2f fd); kNone for anything else. Throws,
// naming `path` and what to do, for the formats lamp does not read that
// corpora come in (xz, bzip2, lz4, zip, 7z, Parquet), and for zstd where
// this lamp was built without it.
Compression compression_of(const uint8_t* head, size_t size,
                           const std::string& path, const char* caller);

// The compression of the file at `path` (compression_of() its first bytes);
// throws naming it where it cannot be opened.
Compression file_compression(const std::string& path, const char* caller);

// Reads the text of one file, decompressed: plain, gzip (several members one
// after another read as their concatenation, as gunzip reads them) or zstd
// (several frames likewise). A damaged, truncated or trailing-garbage stream
// throws naming the file, the compressed offset and the fix.
class TextReader {
 public:
  TextReader(std::string path, const char* caller);
  ~TextReader();
  TextReader(const TextReader&) = delete;
  TextReader& operator=(const TextReader&) = delete;

  // Appends up to `size` bytes of the text to `out`; the number appended,
  // fewer than `size` only at the end of the text (0 there).
  size_t read(std::string& out, size_t size);
  // The next line into `line`, without its '\n' (a last line without one
  // too); false at the end of the text.
  bool getline(std::string& line);

  Compression compression() const { return compression_; }
  const std::string& path() const { return path_; }
  // The bytes of text read so far (decompressed).
  int64_t text_bytes() const { return text_bytes_; }

 private:
  // Makes the decompressor of compression_.
  void start_codec();
  // Up to `capacity` bytes of the text into `dst`; 0 only at its end.
  size_t fill(char* dst, size_t capacity);
  size_t fill_gzip(char* dst, size_t capacity);
  size_t fill_zstd(char* dst, size_t capacity);
  size_t fill_plain(char* dst, size_t capacity);
  // Reads more of the file into input_ (after what is left unread in it);
  // false at the end of the file.
  bool read_input();
  [[noreturn]] void fail(const std::string& what) const;

  struct Codec;
  std::string path_;
  const char* caller_;
  std::FILE* file_ = nullptr;
  Compression compression_ = Compression::kNone;
  std::string input_;     // bytes read from the file
  size_t input_used_ = 0; // input_[0, input_used_) consumed
  int64_t stored_ = 0;    // file bytes before input_'s first
  bool file_ended_ = false;
  std::unique_ptr<Codec> codec_;
  std::string lines_; // getline()'s text read ahead
  size_t lines_used_ = 0;
  size_t lines_searched_ = 0; // lines_[lines_used_, this) holds no '\n'
  bool text_ended_ = false;
  int64_t text_bytes_ = 0;
};

// A file's text size as its headers tell it, without decompressing it.
struct HeaderTextSize {
  int64_t bytes = -1; // -1: the headers do not tell
  bool exact = false; // false: a guess, to check against the text read
};
// A plain file's size (exact); a zstd file's frames' content sizes where
// every frame gives one (exact: libzstd checks each frame against it); a
// gzip file's ISIZE, the last 4 bytes, which is the size modulo 2^32 of the
// last member alone: a guess, taken where the file is under 1 GiB and the
// text no smaller than it.
HeaderTextSize text_size_from_headers(const std::string& path,
                                      const char* caller);

// The size of a file's text: its size for a plain file; a compressed one is
// decompressed to count it. `counted`, where given, grows by the bytes as
// they are counted; `stop`, where given and set, ends the count early (the
// result is then not the size).
int64_t text_file_size(const std::string& path, const char* caller,
                       std::atomic<int64_t>* counted = nullptr,
                       const std::atomic<bool>* stop = nullptr);

} // namespace internal
} // namespace data
} // namespace lamp
