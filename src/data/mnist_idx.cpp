#include "lamp/data/datasets.h"

#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/files.h"
#include "lamp/platform/out_of_memory.h"
#include "platform/memory.h"

// IDX files (MNIST, Fashion-MNIST), plain or gzip-compressed.

namespace lamp {
namespace data {
namespace {

using namespace internal;

constexpr int64_t kMnistClasses = 10;
// The largest IDX header: the magic and 255 big-endian int32 sizes.
constexpr uint64_t kIdxMaxHeaderBytes = 4 + 4 * 255;
constexpr const char* kDebianFashionMnist = "/usr/share/datasets/fashion-mnist";

bool has_gzip_magic(const std::vector<uint8_t>& bytes, size_t offset = 0) {
  return bytes.size() >= offset + 2 && bytes[offset] == 0x1f &&
         bytes[offset + 1] == 0x8b;
}

// Closes a z_stream on every path out of gunzip(), errors included.
struct InflateEnd {
  z_stream* stream;
  ~InflateEnd() { inflateEnd(stream); }
};

// Decompresses a whole gzip file held in memory. Several gzip members one
// after another (what `cat a.gz b.gz` makes) decompress to their
// concatenation, as with gunzip. At most `limit` bytes come out: with
// `prefix`, the first `limit` bytes (fewer when the stream is shorter) and
// the rest is left compressed; without, a longer stream is an error (the
// caller sets `limit` above what the IDX header describes). What is
// allocated follows what comes out, not `limit`.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed,
                            const std::string& path, uint64_t limit,
                            bool prefix) {
  const char* caller = "lamp::data::read_idx";
  z_stream stream{};
  // 15 + 16: a 32 KiB window and a gzip header and trailer (not zlib's).
  int ret = inflateInit2(&stream, 15 + 16);
  TORCH_CHECK(ret == Z_OK, caller, ": zlib's inflateInit2 failed (",
              stream.msg ? stream.msg : zError(ret), ") before decompressing ",
              quoted(path), ".");
  InflateEnd end{&stream};

  TORCH_INTERNAL_ASSERT(limit > 0 &&
                        limit <= std::numeric_limits<size_t>::max());
  // The output grows as the stream decompresses, doubling up to `limit`: a
  // small damaged file whose header claims gigabytes is refused having
  // allocated about what it decompresses to, not what it claims.
  const auto grow = [&](std::vector<uint8_t>& out, uint64_t size) {
    with_memory_context("the decompressed contents of " + quoted(path),
                        static_cast<int64_t>(size),
                        [&] { out.resize(static_cast<size_t>(size)); });
  };
  constexpr uint64_t kFirstOutputBytes = uint64_t{1} << 20;
  std::vector<uint8_t> out;
  grow(out, std::min(limit, kFirstOutputBytes));
  size_t in_pos = 0;
  size_t out_pos = 0;
  while (true) {
    if (out_pos == out.size() && out.size() < limit) {
      grow(out, std::min<uint64_t>(limit, uint64_t{2} * out.size()));
    }
    if (out_pos == out.size()) {
      if (prefix) {
        break;
      }
      TORCH_CHECK(
          false, caller, ": the gzip stream in ", quoted(path),
          " decompresses to more than ", limit,
          " bytes, more than its IDX header describes; the file is corrupt: download it again.");
    }
    // zlib counts in uInt: feed files beyond 4 GiB in pieces.
    const auto in_chunk = static_cast<uInt>(
        std::min<size_t>(compressed.size() - in_pos, UINT_MAX));
    const auto out_chunk =
        static_cast<uInt>(std::min<size_t>(out.size() - out_pos, UINT_MAX));
    stream.next_in = const_cast<Bytef*>(compressed.data() + in_pos);
    stream.avail_in = in_chunk;
    stream.next_out = out.data() + out_pos;
    stream.avail_out = out_chunk;
    ret = inflate(&stream, Z_NO_FLUSH);
    in_pos += in_chunk - stream.avail_in;
    out_pos += out_chunk - stream.avail_out;

    if (ret == Z_STREAM_END) {
      if (in_pos == compressed.size()) {
        break;
      }
      TORCH_CHECK(
          has_gzip_magic(compressed, in_pos), caller, ": ", quoted(path),
          " has ", compressed.size() - in_pos,
          " bytes of trailing data after the end of its gzip stream; the file is corrupt: download it again.");
      ret = inflateReset(&stream);
      TORCH_CHECK(ret == Z_OK, caller, ": zlib's inflateReset failed (",
                  zError(ret), ") in ", quoted(path), ".");
      continue;
    }
    if (ret == Z_OK) {
      continue;
    }
    // Z_BUF_ERROR means no progress was possible: with output space left,
    // the input ran out before the end of the stream.
    if (ret == Z_BUF_ERROR && stream.avail_out == 0) {
      continue;
    }
    TORCH_CHECK(
        ret != Z_BUF_ERROR, caller, ": the gzip stream in ", quoted(path),
        " is truncated: it ends after ", compressed.size(),
        " compressed bytes (", out_pos,
        " decompressed) without the end-of-stream marker; the file is incomplete: download it again.");
    TORCH_CHECK(ret != Z_MEM_ERROR, caller,
                ": zlib ran out of memory decompressing ", quoted(path), ".");
    TORCH_CHECK(false, caller, ": the gzip stream in ", quoted(path),
                " is corrupt (zlib: ", stream.msg ? stream.msg : zError(ret),
                ", after ", in_pos,
                " compressed bytes); download the file again.");
  }
  out.resize(out_pos);
  return out;
}

const char* idx_type_name(uint8_t code) {
  switch (code) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "not an IDX type";
  }
}

// What an IDX header declares.
struct IdxHeader {
  std::vector<int64_t> sizes;
  uint64_t header_bytes = 0;
  uint64_t data_bytes = 0; // the product of the sizes
  bool overflow = false;   // the product exceeds 2^64

  // "[60000, 28, 28], 44.9 MiB (47040000 bytes) of data".
  std::string describe() const {
    std::ostringstream text;
    text << torch::IntArrayRef(sizes) << ", "
         << (overflow ? std::string("more than 2^64 bytes")
                      : byte_count(data_bytes))
         << " of data";
    return text.str();
  }
};

// Parses the header at the start of an IDX file (`where` names it in
// messages); `bytes` holds its first `size` bytes (the whole file, or at
// least kIdxMaxHeaderBytes of it).
IdxHeader parse_idx_header(const uint8_t* bytes, uint64_t size,
                           const std::string& where) {
  const char* caller = "lamp::data::read_idx";
  TORCH_CHECK(
      size >= 4, caller, ": ", where, " holds ", size,
      " bytes, too few for the 4-byte IDX magic (0x00 0x00 <type> <ndims>); it is truncated or not an IDX file.");
  TORCH_CHECK(
      bytes[0] == 0 && bytes[1] == 0, caller, ": ", where,
      " starts with the bytes ", hex_byte(bytes[0]), " ", hex_byte(bytes[1]),
      " ", hex_byte(bytes[2]), " ", hex_byte(bytes[3]),
      ", not the IDX magic 0x00 0x00 <type> <ndims>: wrong magic, it is not an IDX (MNIST-format) file.");
  TORCH_CHECK(
      bytes[2] == 0x08, caller, ": ", where,
      " has the unsupported IDX type code ", hex_byte(bytes[2]), " (",
      idx_type_name(bytes[2]),
      "): lamp reads only 0x08 (unsigned byte), the type of MNIST's images and labels.");
  const int ndims = bytes[3];
  TORCH_CHECK(
      ndims >= 1, caller, ": ", where,
      " declares 0 dimensions; an IDX file of images or labels has at least one.");
  IdxHeader header;
  header.header_bytes = 4 + 4 * static_cast<uint64_t>(ndims);
  TORCH_CHECK(size >= header.header_bytes, caller, ": ", where,
              " is truncated: its magic declares ", ndims,
              " dimensions, a header of ", header.header_bytes,
              " bytes, but it holds only ", size, " bytes.");
  uint64_t numel = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* p = bytes + 4 + 4 * d;
    const uint64_t n = uint64_t{p[0]} << 24 | uint64_t{p[1]} << 16 |
                       uint64_t{p[2]} << 8 | uint64_t{p[3]};
    TORCH_CHECK(n <= static_cast<uint64_t>(INT32_MAX), caller, ": ", where,
                " gives dimension ", d, " the size ", n,
                ", beyond the format's int32 range; the header is corrupt.");
    header.sizes.push_back(static_cast<int64_t>(n));
    if (n != 0 && numel > std::numeric_limits<uint64_t>::max() / n) {
      header.overflow = true;
    }
    numel *= n;
  }
  header.data_bytes = numel;
  return header;
}

// Checks that an IDX file of `size` bytes holds exactly the data its header
// declares.
void check_idx_length(const IdxHeader& header, uint64_t size,
                      const std::string& where) {
  const char* caller = "lamp::data::read_idx";
  const uint64_t available = size - header.header_bytes;
  const uint64_t numel = header.data_bytes;
  TORCH_CHECK(
      !header.overflow && numel <= available, caller, ": ", where,
      " is truncated: its sizes ", torch::IntArrayRef(header.sizes), " need ",
      header.overflow ? std::string("more than 2^64") : std::to_string(numel),
      " data bytes but only ", available, " follow the ", header.header_bytes,
      "-byte header; the file is incomplete: download it again.");
  TORCH_CHECK(
      numel == available, caller, ": ", where, " holds ", available - numel,
      " bytes more than its sizes ", torch::IntArrayRef(header.sizes),
      " describe (", numel, " data bytes after the ", header.header_bytes,
      "-byte header): the sizes are inconsistent with the file length, so the file is corrupt or not an IDX file.");
}

// Refuses, before anything is allocated, an IDX header that declares more
// data than this machine could hold.
void check_idx_fits_in_memory(const IdxHeader& header,
                              const std::string& where) {
  const uint64_t memory = lamp::detail::physical_memory_bytes();
  TORCH_CHECK(
      !header.overflow && header.data_bytes <= memory,
      "lamp::data::read_idx: the header of ", where, " declares the sizes ",
      header.describe(), ", more than ", memory_text(),
      "; the header is corrupt or this is not an MNIST-format file (MNIST's largest file holds 47,040,000 data bytes).");
}

// Parses a whole IDX file held in memory (`where` names it in messages) into
// a uint8 tensor.
torch::Tensor parse_idx(const uint8_t* bytes, uint64_t size,
                        const std::string& where) {
  const auto header = parse_idx_header(bytes, size, where);
  check_idx_length(header, size, where);
  auto tensor = with_memory_context(
      "the data of " + where, static_cast<int64_t>(header.data_bytes),
      [&] { return torch::empty(header.sizes, torch::kUInt8); });
  if (header.data_bytes > 0) {
    std::memcpy(tensor.data_ptr<uint8_t>(), bytes + header.header_bytes,
                static_cast<size_t>(header.data_bytes));
  }
  return tensor;
}

} // namespace

torch::Tensor read_idx(const std::string& path) {
  const char* caller = "lamp::data::read_idx";
  const uint64_t size = regular_file_size(path, caller);
  // The header first: it says how much data follows, so a file that cannot
  // be an IDX file, or that could not fit in memory, is refused before
  // anything large is allocated (a sparse file can claim terabytes).
  const auto head =
      read_file_bytes(path, std::min(size, kIdxMaxHeaderBytes), caller);
  if (!has_gzip_magic(head)) {
    const auto header =
        parse_idx_header(head.data(), head.size(), quoted(path));
    check_idx_length(header, size, quoted(path));
    check_idx_fits_in_memory(header, quoted(path));
    const auto bytes = read_file_bytes(path, size, caller);
    return parse_idx(bytes.data(), bytes.size(), quoted(path));
  }
  TORCH_CHECK(
      size <= lamp::detail::physical_memory_bytes(), caller, ": ", quoted(path),
      " is a gzip file of ", byte_count(size), ", more than ", memory_text(),
      "; MNIST-format files are tens of megabytes, so this one is corrupt or not MNIST data.");
  const auto compressed = read_file_bytes(path, size, caller);
  const std::string where = "the decompressed contents of " + quoted(path);
  const auto start = gunzip(compressed, path, kIdxMaxHeaderBytes, true);
  const auto header = parse_idx_header(start.data(), start.size(), where);
  check_idx_fits_in_memory(header, where);
  // Room for what the header declares and a little more, so that a few
  // bytes too many are counted in parse_idx's message.
  constexpr uint64_t kSlack = uint64_t{1} << 20;
  const auto raw =
      gunzip(compressed, path, header.header_bytes + header.data_bytes + kSlack,
             false);
  return parse_idx(raw.data(), raw.size(), where);
}

Dataset read_mnist(const std::string& directory, bool train) {
  const char* caller = "lamp::data::read_mnist";
  const std::string split = train ? "train" : "t10k";
  const std::string names[2] = {split + "-images-idx3-ubyte",
                                split + "-labels-idx1-ubyte"};
  std::string paths[2];
  std::vector<std::string> looked_for;
  std::vector<std::string> missing;
  for (int i = 0; i < 2; ++i) {
    const auto plain = join_path(directory, names[i]);
    const auto gz = plain + ".gz";
    looked_for.push_back(plain);
    looked_for.push_back(gz);
    for (const auto& path : {plain, gz}) {
      refuse_non_file(path, caller,
                      "put the IDX file " + names[i] +
                          " (or its .gz) there instead, or remove it");
    }
    if (regular_file_exists(plain)) {
      paths[i] = plain;
    } else if (regular_file_exists(gz)) {
      paths[i] = gz;
    } else {
      missing.push_back(names[i] + "[.gz]");
    }
  }
  TORCH_CHECK(
      missing.empty(), caller, ": ", (train ? "train" : "test"),
      " data not found in ", quoted(directory), ": missing ",
      join(missing, " and "), " (it looks for ", join(looked_for, ", "), "). ",
      describe_directory(directory),
      ". For Fashion-MNIST install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist, into ",
      kDebianFashionMnist,
      "); for MNIST put the four files of http://yann.lecun.com/exdb/mnist/ (gzipped or not) in the directory.");

  // Named copies: std::quoted's overload for a non-const string would win
  // over quoted() for the elements of `paths`.
  const std::string images_path = paths[0];
  const std::string labels_path = paths[1];
  auto images = read_idx(images_path);
  auto labels = read_idx(labels_path);
  TORCH_CHECK(
      images.dim() == 3, caller, ": ", quoted(images_path), " has sizes ",
      images.sizes(),
      "; an images file must be 3-dimensional [N, H, W] (idx3). Check that the files are not swapped.");
  TORCH_CHECK(
      labels.dim() == 1, caller, ": ", quoted(labels_path), " has sizes ",
      labels.sizes(),
      "; a labels file must be 1-dimensional [N] (idx1). Check that the files are not swapped.");
  TORCH_CHECK(
      images.size(0) == labels.size(0), caller, ": ", quoted(images_path),
      " holds ", images.size(0), " images but ", quoted(labels_path), " holds ",
      labels.size(0),
      " labels; the counts must match: use files of the same split and dataset.");
  TORCH_CHECK(images.size(0) > 0, caller, ": ", quoted(images_path),
              " holds no images.");
  TORCH_CHECK(images.size(1) > 0 && images.size(2) > 0, caller, ": ",
              quoted(images_path), " has empty images of ", images.size(1), "x",
              images.size(2), " pixels.");
  const auto bad = (labels >= kMnistClasses).nonzero();
  if (bad.numel() > 0) {
    const int64_t record = bad[0][0].item<int64_t>();
    TORCH_CHECK(false, caller, ": ", quoted(labels_path), ": label ",
                labels[record].item<int64_t>(), " at record ", record,
                " is outside 0..", kMnistClasses - 1,
                "; the file is corrupt or not MNIST-format labels.");
  }
  return {images.unsqueeze(1), labels.to(torch::kLong)};
}

std::string default_fashion_mnist_directory() {
  return directory_exists(kDebianFashionMnist) ? kDebianFashionMnist : "";
}

} // namespace data
} // namespace lamp
