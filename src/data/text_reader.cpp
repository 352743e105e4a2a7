#include "data/text_reader.h"

#include <torch/torch.h>
#include <zlib.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>
#include <utility>

#if LAMP_WITH_ZSTD
#include <zstd.h>
#endif

#include "data/files.h"

namespace lamp {
namespace data {
namespace internal {
namespace {

// What is read from the file, and decompressed, at a time.
constexpr size_t kBlockBytes = size_t{1} << 20;

bool starts_with(const uint8_t* head, size_t size, const char* magic,
                 size_t magic_size) {
  return size >= magic_size && std::memcmp(head, magic, magic_size) == 0;
}

// Whether the last 4 bytes of `path` are Parquet's "PAR1" (as its first).
bool ends_as_parquet(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return false;
  }
  char tail[4] = {};
  const bool found = std::fseek(file, -4, SEEK_END) == 0 &&
                     std::fread(tail, 1, 4, file) == 4 &&
                     std::memcmp(tail, "PAR1", 4) == 0;
  std::fclose(file);
  return found;
}

#if LAMP_WITH_ZSTD
// The content size of a zstd file's frames, `size` bytes at `bytes`, from
// their headers (skippable frames hold none); -1 where a frame does not
// give it or the headers are damaged (the reading then says where).
int64_t zstd_content_size(const uint8_t* bytes, size_t size) {
  int64_t total = 0;
  size_t at = 0;
  while (at < size) {
    const size_t left = size - at;
    if (left >= 8 && (bytes[at] & 0xF0) == 0x50 && bytes[at + 1] == 0x2a &&
        bytes[at + 2] == 0x4d && bytes[at + 3] == 0x18) {
      const uint64_t skipped =
          uint64_t{bytes[at + 4]} | uint64_t{bytes[at + 5]} << 8 |
          uint64_t{bytes[at + 6]} << 16 | uint64_t{bytes[at + 7]} << 24;
      if (skipped > left - 8) {
        return -1;
      }
      at += 8 + static_cast<size_t>(skipped);
      continue;
    }
    const unsigned long long content =
        ZSTD_getFrameContentSize(bytes + at, left);
    const size_t frame = ZSTD_findFrameCompressedSize(bytes + at, left);
    if (content == ZSTD_CONTENTSIZE_UNKNOWN ||
        content == ZSTD_CONTENTSIZE_ERROR || ZSTD_isError(frame) != 0 ||
        frame == 0 ||
        content > static_cast<unsigned long long>(
                      std::numeric_limits<int64_t>::max() - total)) {
      return -1;
    }
    total += static_cast<int64_t>(content);
    at += frame;
  }
  return total;
}
#endif

} // namespace

bool zstd_available() {
  return LAMP_WITH_ZSTD != 0;
}

Compression compression_of(const uint8_t* head, size_t size,
                           const std::string& path, const char* caller) {
  if (starts_with(head, size, "\x1f\x8b", 2)) {
    return Compression::kGzip;
  }
  // A zstd frame, or a skippable frame (0x184D2A50 to 0x184D2A5F) first.
  const bool zstd = starts_with(head, size, "\x28\xb5\x2f\xfd", 4) ||
                    (size >= 4 && (head[0] & 0xF0) == 0x50 &&
                     starts_with(head + 1, size - 1, "\x2a\x4d\x18", 3));
  if (zstd) {
    TORCH_CHECK(zstd_available(), caller, ": ", quoted(path),
                " is compressed with zstd, and this lamp was built without "
                "zstd. Install libzstd-dev and build lamp again (CMake's "
                "LAMP_WITH_ZSTD), or decompress it first (zstd -d ",
                quoted(path), ").");
    return Compression::kZstd;
  }
  struct Refused {
    const char* magic;
    size_t size;
    const char* what;
  };
  // bzip2: "BZh", a block size digit and its first block's magic (pi's
  // digits), so that a text that starts with "BZh" is still a text.
  static const Refused kRefused[] = {
      {"\xfd"
       "7zXZ\x00",
       6, "compressed with xz: decompress it first (xz -d "},
      {"\x04\x22\x4d\x18", 4,
       "compressed with lz4: decompress it first (lz4 -d "},
      {"PK\x03\x04", 4, "a zip archive: extract its files first (unzip "},
      {"7z\xbc\xaf\x27\x1c", 6, "a 7z archive: extract its files first (7z x "},
  };
  for (const auto& refused : kRefused) {
    TORCH_CHECK(!starts_with(head, size, refused.magic, refused.size), caller,
                ": ", quoted(path), " is ", refused.what, quoted(path),
                "), or compress it with gzip or zstd, which lamp reads.");
  }
  const bool bzip2 =
      size >= 10 && starts_with(head, size, "BZh", 3) && head[3] >= '1' &&
      head[3] <= '9' &&
      (starts_with(head + 4, size - 4, "\x31\x41\x59\x26\x53\x59", 6) ||
       starts_with(head + 4, size - 4, "\x17\x72\x45\x38\x50\x90", 6));
  TORCH_CHECK(!bzip2, caller, ": ", quoted(path),
              " is compressed with bzip2: decompress it first (bzip2 -d ",
              quoted(path),
              "), or compress it with gzip or zstd, which lamp "
              "reads.");
  TORCH_CHECK(!(starts_with(head, size, "PAR1", 4) && ends_as_parquet(path)),
              caller, ": ", quoted(path),
              " is a Parquet file (a table), and lamp reads text and JSON "
              "Lines. Write its text column as JSON Lines first, e.g. in "
              "Python: pandas.read_parquet(",
              quoted(path),
              ").to_json('out.jsonl', orient='records', lines=True).");
  return Compression::kNone;
}

Compression file_compression(const std::string& path, const char* caller) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  TORCH_CHECK(file != nullptr, caller, ": cannot open ", quoted(path), ": ",
              std::strerror(errno), "; check that it exists and is readable.");
  uint8_t head[16] = {};
  const size_t got = std::fread(head, 1, sizeof(head), file);
  std::fclose(file);
  return compression_of(head, got, path, caller);
}

struct TextReader::Codec {
  z_stream gzip{};
  bool gzip_ready = false;
  bool in_member = false; // inside a gzip member, or a zstd frame
#if LAMP_WITH_ZSTD
  ZSTD_DCtx* zstd = nullptr;
#endif
  ~Codec() {
    if (gzip_ready) {
      inflateEnd(&gzip);
    }
#if LAMP_WITH_ZSTD
    ZSTD_freeDCtx(zstd);
#endif
  }
};

TextReader::TextReader(std::string path, const char* caller)
    : path_(std::move(path)), caller_(caller) {
  file_ = std::fopen(path_.c_str(), "rb");
  TORCH_CHECK(file_ != nullptr, caller_, ": cannot open ", quoted(path_), ": ",
              std::strerror(errno), "; check that it exists and is readable.");
  try {
    read_input();
    compression_ =
        compression_of(reinterpret_cast<const uint8_t*>(input_.data()),
                       input_.size(), path_, caller_);
    start_codec();
  } catch (...) {
    // No destructor runs for a constructor that throws.
    std::fclose(file_);
    file_ = nullptr;
    throw;
  }
}

void TextReader::start_codec() {
  if (compression_ == Compression::kNone) {
    return;
  }
  codec_ = std::make_unique<Codec>();
  if (compression_ == Compression::kGzip) {
    // 15 + 16: a 32 KiB window and a gzip header and trailer (not zlib's).
    const int ret = inflateInit2(&codec_->gzip, 15 + 16);
    TORCH_CHECK(ret == Z_OK, caller_, ": zlib's inflateInit2 failed (",
                zError(ret), ") before decompressing ", quoted(path_), ".");
    codec_->gzip_ready = true;
    return;
  }
#if LAMP_WITH_ZSTD
  codec_->zstd = ZSTD_createDCtx();
  TORCH_CHECK(codec_->zstd != nullptr, caller_,
              ": zstd could not make its decompression context for ",
              quoted(path_), " (out of memory).");
  // Frames made with zstd --long=31 need a window of 2 GiB: take them, as
  // `zstd -d --memory=2048MB` does (the default stops at 128 MiB).
  ZSTD_DCtx_setParameter(codec_->zstd, ZSTD_d_windowLogMax, 31);
#endif
}

TextReader::~TextReader() {
  if (file_ != nullptr) {
    std::fclose(file_);
  }
}

void TextReader::fail(const std::string& what) const {
  TORCH_CHECK(false, caller_, ": ", quoted(path_), " ", what);
}

bool TextReader::read_input() {
  if (file_ended_) {
    return false;
  }
  // Keeps what is left unread (a gzip member's magic being checked).
  stored_ += static_cast<int64_t>(input_used_);
  input_.erase(0, input_used_);
  input_used_ = 0;
  const size_t old = input_.size();
  input_.resize(old + kBlockBytes);
  const size_t got = std::fread(&input_[old], 1, kBlockBytes, file_);
  input_.resize(old + got);
  if (got < kBlockBytes) {
    if (std::ferror(file_) != 0) {
      fail(std::string("could not be read: ") + std::strerror(errno) +
           " (after " + std::to_string(stored_ + static_cast<int64_t>(old)) +
           " bytes).");
    }
    file_ended_ = true;
  }
  return got > 0;
}

size_t TextReader::fill(char* dst, size_t capacity) {
  const size_t produced =
      compression_ == Compression::kGzip   ? fill_gzip(dst, capacity)
      : compression_ == Compression::kZstd ? fill_zstd(dst, capacity)
                                           : fill_plain(dst, capacity);
  text_bytes_ += static_cast<int64_t>(produced);
  return produced;
}

size_t TextReader::fill_plain(char* dst, size_t capacity) {
  size_t produced = std::min(capacity, input_.size() - input_used_);
  std::memcpy(dst, input_.data() + input_used_, produced);
  input_used_ += produced;
  while (produced < capacity && !file_ended_) {
    const size_t wanted = capacity - produced;
    const size_t got = std::fread(dst + produced, 1, wanted, file_);
    produced += got;
    if (got < wanted) {
      if (std::ferror(file_) != 0) {
        fail(std::string("could not be read: ") + std::strerror(errno) + ".");
      }
      file_ended_ = true;
    }
  }
  return produced;
}

size_t TextReader::fill_gzip(char* dst, size_t capacity) {
  z_stream& stream = codec_->gzip;
  size_t produced = 0;
  while (produced < capacity) {
    if (input_used_ == input_.size() && !read_input()) {
      if (codec_->in_member) {
        fail("is truncated: its gzip stream stops after " +
             std::to_string(stored_ + static_cast<int64_t>(input_used_)) +
             " bytes without its end; the file is incomplete: copy or "
             "download it again.");
      }
      break;
    }
    if (!codec_->in_member) {
      // A member starts: the file's first, or one after another (what
      // `cat a.gz b.gz` makes), read as their concatenation.
      while (input_.size() - input_used_ < 2 && read_input()) {
      }
      const auto* next =
          reinterpret_cast<const uint8_t*>(input_.data() + input_used_);
      const bool member = input_.size() - input_used_ >= 2 && next[0] == 0x1f &&
                          next[1] == 0x8b;
      if (!member) {
        fail("has data after the end of its gzip stream (at byte " +
             std::to_string(stored_ + static_cast<int64_t>(input_used_)) +
             ") that is not another gzip member; the file is damaged: "
             "copy or download it again.");
      }
      const int ret = inflateReset(&stream);
      TORCH_CHECK(ret == Z_OK, caller_, ": zlib's inflateReset failed (",
                  zError(ret), ") in ", quoted(path_), ".");
      codec_->in_member = true;
    }
    // zlib counts in uInt: larger blocks go in pieces.
    const auto in_chunk = static_cast<uInt>(
        std::min<size_t>(input_.size() - input_used_, UINT_MAX));
    const auto out_chunk =
        static_cast<uInt>(std::min<size_t>(capacity - produced, UINT_MAX));
    stream.next_in = reinterpret_cast<Bytef*>(
        const_cast<char*>(input_.data() + input_used_));
    stream.avail_in = in_chunk;
    stream.next_out = reinterpret_cast<Bytef*>(dst + produced);
    stream.avail_out = out_chunk;
    const int ret = inflate(&stream, Z_NO_FLUSH);
    input_used_ += in_chunk - stream.avail_in;
    produced += out_chunk - stream.avail_out;
    if (ret == Z_STREAM_END) {
      codec_->in_member = false;
      continue;
    }
    // Z_BUF_ERROR: no progress without more input, which the loop reads.
    if (ret == Z_OK || ret == Z_BUF_ERROR) {
      continue;
    }
    TORCH_CHECK(ret != Z_MEM_ERROR, caller_,
                ": zlib ran out of memory decompressing ", quoted(path_), ".");
    fail(std::string("is damaged: its gzip stream is corrupt (zlib: ") +
         (stream.msg != nullptr ? stream.msg : zError(ret)) + ", at byte " +
         std::to_string(stored_ + static_cast<int64_t>(input_used_)) +
         "); copy or download it again.");
  }
  return produced;
}

size_t TextReader::fill_zstd(char* dst, size_t capacity) {
#if LAMP_WITH_ZSTD
  size_t produced = 0;
  while (produced < capacity) {
    if (input_used_ == input_.size()) {
      read_input();
    }
    ZSTD_inBuffer in{input_.data() + input_used_, input_.size() - input_used_,
                     0};
    ZSTD_outBuffer out{dst + produced, capacity - produced, 0};
    const size_t ret = ZSTD_decompressStream(codec_->zstd, &out, &in);
    input_used_ += in.pos;
    produced += out.pos;
    if (ZSTD_isError(ret) != 0) {
      fail(std::string("is damaged: its zstd stream is corrupt (zstd: ") +
           ZSTD_getErrorName(ret) + ", at byte " +
           std::to_string(stored_ + static_cast<int64_t>(input_used_)) +
           "); copy or download it again.");
    }
    if (in.pos > 0 || out.pos > 0) {
      // 0: a frame ends here, and all of it has come out.
      codec_->in_member = ret != 0;
      continue;
    }
    // No progress: the file has ended (zstd holds back nothing it could
    // give with the output room it had).
    if (codec_->in_member) {
      fail("is truncated: its zstd stream stops after " +
           std::to_string(stored_ + static_cast<int64_t>(input_used_)) +
           " bytes inside a frame; the file is incomplete: copy or "
           "download it again.");
    }
    break;
  }
  return produced;
#else
  (void)dst;
  (void)capacity;
  TORCH_INTERNAL_ASSERT(false, "zstd read without zstd");
#endif
}

size_t TextReader::read(std::string& out, size_t size) {
  const size_t old = out.size();
  out.resize(old + size);
  // What getline() read ahead comes first.
  size_t produced = std::min(size, lines_.size() - lines_used_);
  std::memcpy(&out[old], lines_.data() + lines_used_, produced);
  lines_used_ += produced;
  lines_searched_ = std::max(lines_searched_, lines_used_);
  while (produced < size && !text_ended_) {
    const size_t got = fill(&out[old + produced], size - produced);
    text_ended_ = got == 0;
    produced += got;
  }
  out.resize(old + produced);
  return produced;
}

bool TextReader::getline(std::string& line) {
  while (true) {
    const char* begin = lines_.data() + lines_used_;
    // lines_[lines_used_, lines_searched_) holds no '\n'.
    const size_t from = lines_searched_ - lines_used_;
    const size_t left = lines_.size() - lines_used_;
    if (const auto* end = static_cast<const char*>(
            std::memchr(begin + from, '\n', left - from))) {
      const auto n = static_cast<size_t>(end - begin);
      line.assign(begin, n);
      lines_used_ += n + 1;
      lines_searched_ = lines_used_;
      return true;
    }
    if (text_ended_) {
      if (left == 0) {
        return false;
      }
      line.assign(begin, left);
      lines_used_ = lines_searched_ = lines_.size();
      return true;
    }
    lines_.erase(0, lines_used_);
    lines_searched_ = lines_.size();
    lines_used_ = 0;
    const size_t old = lines_.size();
    lines_.resize(old + kBlockBytes);
    const size_t got = fill(&lines_[old], kBlockBytes);
    lines_.resize(old + got);
    text_ended_ = got == 0;
  }
}

HeaderTextSize text_size_from_headers(const std::string& path,
                                      const char* caller) {
  HeaderTextSize size;
  const auto compression = file_compression(path, caller);
  const auto stored = static_cast<int64_t>(regular_file_size(path, caller));
  if (compression == Compression::kNone) {
    size.bytes = stored;
    size.exact = true;
    return size;
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    return size;
  }
  if (compression == Compression::kGzip) {
    uint8_t tail[4] = {};
    constexpr int64_t kLargestGuessed = int64_t{1} << 30;
    if (stored >= 4 && stored < kLargestGuessed &&
        ::pread(fd, tail, 4, stored - 4) == 4) {
      const int64_t isize = int64_t{tail[0]} | int64_t{tail[1]} << 8 |
                            int64_t{tail[2]} << 16 | int64_t{tail[3]} << 24;
      if (isize >= stored) {
        size.bytes = isize;
      }
    }
  }
#if LAMP_WITH_ZSTD
  if (compression == Compression::kZstd && stored > 0) {
    void* bytes = ::mmap(nullptr, static_cast<size_t>(stored), PROT_READ,
                         MAP_PRIVATE, fd, 0);
    if (bytes != MAP_FAILED) {
      // Walks the frames' and blocks' headers, decompressing nothing.
      const auto found = zstd_content_size(static_cast<const uint8_t*>(bytes),
                                           static_cast<size_t>(stored));
      if (found >= 0) {
        size.bytes = found;
        size.exact = true;
      }
      ::munmap(bytes, static_cast<size_t>(stored));
    }
  }
#endif
  ::close(fd);
  return size;
}

int64_t text_file_size(const std::string& path, const char* caller,
                       std::atomic<int64_t>* counted,
                       const std::atomic<bool>* stop) {
  int64_t size = 0;
  if (file_compression(path, caller) == Compression::kNone) {
    size = static_cast<int64_t>(regular_file_size(path, caller));
    if (counted != nullptr) {
      *counted += size;
    }
    return size;
  }
  TextReader reader(path, caller);
  std::string block;
  while (stop == nullptr || !stop->load()) {
    block.clear();
    const auto got = static_cast<int64_t>(reader.read(block, kBlockBytes));
    if (got == 0) {
      break;
    }
    size += got;
    if (counted != nullptr) {
      *counted += got;
    }
  }
  return size;
}

} // namespace internal
} // namespace data
} // namespace lamp
