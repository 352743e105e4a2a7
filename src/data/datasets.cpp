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

#include "detail/memory.h"

namespace lamp {
namespace data {
namespace {

constexpr int64_t kCifarImageBytes = 3 * 32 * 32;
constexpr int64_t kCifarRecordBytes = 1 + kCifarImageBytes;
constexpr int64_t kCifarClasses = 10;
constexpr int64_t kMnistClasses = 10;
// The largest IDX header: the magic and 255 big-endian int32 sizes.
constexpr uint64_t kIdxMaxHeaderBytes = 4 + 4 * 255;
constexpr const char* kCifarBinaryUrl =
    "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";
constexpr const char* kDebianFashionMnist = "/usr/share/datasets/fashion-mnist";

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

std::string join(const std::vector<std::string>& items,
                 const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i == 0 ? "" : separator) + items[i];
  }
  return out;
}

std::string hex_byte(uint8_t b) {
  char text[8];
  std::snprintf(text, sizeof(text), "0x%02x", static_cast<unsigned>(b));
  return text;
}

// "1.5 GiB (1610612736 bytes)".
std::string byte_count(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) {
    return std::to_string(bytes) + " bytes";
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f %s (%llu bytes)", value, units[unit],
                static_cast<unsigned long long>(bytes));
  return text;
}

// "this machine's 23.4 GiB (...) of memory".
std::string memory_text() {
  return "this machine's " + byte_count(lamp::detail::physical_memory_bytes()) + " of memory";
}

// POSIX calls rather than std::filesystem: the PyTorch 2.x wheels export
// their own, older copy of libstdc++'s std::filesystem from libtorch.so and
// libtorch_cpu.so, which then replaces the system one in the whole program
// (pytorch/pytorch#133437); its remove_all() crashes with the 2.11 wheel.

enum class PathKind { kMissing, kFile, kDirectory, kOther };

PathKind path_kind(const std::string& path, uint64_t* size = nullptr) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return PathKind::kMissing;
  }
  if (S_ISREG(st.st_mode)) {
    if (size != nullptr) {
      *size = static_cast<uint64_t>(st.st_size);
    }
    return PathKind::kFile;
  }
  return S_ISDIR(st.st_mode) ? PathKind::kDirectory : PathKind::kOther;
}

bool regular_file_exists(const std::string& path) {
  return path_kind(path) == PathKind::kFile;
}

bool directory_exists(const std::string& path) {
  return path_kind(path) == PathKind::kDirectory;
}

std::string join_path(const std::string& directory, const std::string& name) {
  if (directory.empty()) {
    return name;
  }
  return directory.back() == '/' ? directory + name : directory + "/" + name;
}

// "'dir' holds a, b, c": what a directory does hold, for "file not found"
// messages (the usual mistake is one directory level too high or too low).
std::string describe_directory(const std::string& directory) {
  if (!directory_exists(directory)) {
    return "The directory " + quoted(directory) + " does not exist";
  }
  std::vector<std::string> names;
  if (DIR* dir = ::opendir(directory.c_str())) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") {
        names.push_back(name);
      }
    }
    ::closedir(dir);
  }
  if (names.empty()) {
    return "The directory " + quoted(directory) + " is empty";
  }
  std::sort(names.begin(), names.end());
  constexpr size_t kShown = 12;
  const size_t more = names.size() > kShown ? names.size() - kShown : 0;
  names.resize(std::min(names.size(), kShown));
  std::string text = quoted(directory) + " holds " + join(names, ", ");
  if (more > 0) {
    text += " and " + std::to_string(more) + " more";
  }
  return text;
}

// The size of the regular file at `path`; a clear error when there is none.
uint64_t regular_file_size(const std::string& path, const char* caller) {
  uint64_t size = 0;
  const PathKind kind = path_kind(path, &size);
  TORCH_CHECK(kind != PathKind::kMissing, caller, ": the file ", quoted(path),
              " does not exist (or cannot be accessed).");
  TORCH_CHECK(kind == PathKind::kFile, caller, ": ", quoted(path),
              " is not a regular file; pass the path of the data file itself.");
  return size;
}

// Reads the first `size` bytes of `path` (all of it when `size` is the size
// measured before) into `dst` in one read.
void read_whole_file(const std::string& path, uint64_t size, uint8_t* dst,
                     const char* caller) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.is_open(), caller, ": cannot open ", quoted(path),
              " for reading; check that it exists and is readable.");
  TORCH_CHECK(
      size <=
          static_cast<uint64_t>(std::numeric_limits<std::streamsize>::max()),
      caller, ": ", quoted(path), " is too large (", size, " bytes) to read.");
  const auto wanted = static_cast<std::streamsize>(size);
  if (wanted > 0) {
    in.read(reinterpret_cast<char*>(dst), wanted);
  }
  TORCH_CHECK(in.gcount() == wanted, caller, ": read only ", in.gcount(),
              " of the ", size, " bytes of ", quoted(path),
              "; the file changed while being read or the disk failed.");
}

// The first `size` bytes of `path`.
std::vector<uint8_t> read_file_bytes(const std::string& path, uint64_t size,
                                     const char* caller) {
  TORCH_CHECK(size <= std::numeric_limits<size_t>::max(), caller, ": ",
              quoted(path), " is too large (", size, " bytes) to read.");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  read_whole_file(path, size, bytes.data(), caller);
  return bytes;
}

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
// caller sets `limit` above what the IDX header describes).
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

  TORCH_INTERNAL_ASSERT(limit <= std::numeric_limits<size_t>::max());
  std::vector<uint8_t> out(static_cast<size_t>(limit));
  size_t in_pos = 0;
  size_t out_pos = 0;
  while (true) {
    if (out_pos == out.size()) {
      if (prefix) {
        break;
      }
      TORCH_CHECK(false, caller, ": the gzip stream in ", quoted(path),
                  " decompresses to more than ", limit,
                  " bytes, more than its IDX header describes; the file is "
                  "corrupt: download it again.");
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
      TORCH_CHECK(has_gzip_magic(compressed, in_pos), caller, ": ",
                  quoted(path), " has ", compressed.size() - in_pos,
                  " bytes of trailing data after the end of its gzip stream; "
                  "the file is corrupt: download it again.");
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
    TORCH_CHECK(ret != Z_BUF_ERROR, caller, ": the gzip stream in ",
                quoted(path), " is truncated: it ends after ",
                compressed.size(), " compressed bytes (", out_pos,
                " decompressed) without the end-of-stream marker; the file "
                "is incomplete: download it again.");
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
  TORCH_CHECK(size >= 4, caller, ": ", where, " holds ", size,
              " bytes, too few for the 4-byte IDX magic (0x00 0x00 <type> "
              "<ndims>); it is truncated or not an IDX file.");
  TORCH_CHECK(bytes[0] == 0 && bytes[1] == 0, caller, ": ", where,
              " starts with the bytes ", hex_byte(bytes[0]), " ",
              hex_byte(bytes[1]), " ", hex_byte(bytes[2]), " ",
              hex_byte(bytes[3]),
              ", not the IDX magic 0x00 0x00 <type> <ndims>: wrong magic, "
              "it is not an IDX (MNIST-format) file.");
  TORCH_CHECK(bytes[2] == 0x08, caller, ": ", where,
              " has the unsupported IDX type code ", hex_byte(bytes[2]), " (",
              idx_type_name(bytes[2]),
              "): lamp reads only 0x08 (unsigned "
              "byte), the type of MNIST's images and labels.");
  const int ndims = bytes[3];
  TORCH_CHECK(ndims >= 1, caller, ": ", where,
              " declares 0 dimensions; an IDX file of images or labels has "
              "at least one.");
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
  TORCH_CHECK(numel == available, caller, ": ", where, " holds ",
              available - numel, " bytes more than its sizes ",
              torch::IntArrayRef(header.sizes), " describe (", numel,
              " data bytes after the ", header.header_bytes,
              "-byte header): the sizes are inconsistent with the file "
              "length, so the file is corrupt or not an IDX file.");
}

// Refuses, before anything is allocated, an IDX header that declares more
// data than this machine could hold.
void check_idx_fits_in_memory(const IdxHeader& header,
                              const std::string& where) {
  const uint64_t memory = lamp::detail::physical_memory_bytes();
  TORCH_CHECK(!header.overflow && header.data_bytes <= memory,
              "lamp::data::read_idx: the header of ", where,
              " declares the sizes ", header.describe(), ", more than ",
              memory_text(),
              "; the header is corrupt or this is not an MNIST-format file "
              "(MNIST's largest file holds 47,040,000 data bytes).");
}

// Parses a whole IDX file held in memory (`where` names it in messages) into
// a uint8 tensor.
torch::Tensor parse_idx(const uint8_t* bytes, uint64_t size,
                        const std::string& where) {
  const auto header = parse_idx_header(bytes, size, where);
  check_idx_length(header, size, where);
  auto tensor = torch::empty(header.sizes, torch::kUInt8);
  if (header.data_bytes > 0) {
    std::memcpy(tensor.data_ptr<uint8_t>(), bytes + header.header_bytes,
                static_cast<size_t>(header.data_bytes));
  }
  return tensor;
}

std::string cifar_missing_message(const std::string& directory, bool train,
                                  const std::vector<std::string>& files,
                                  const std::vector<std::string>& missing) {
  std::ostringstream m;
  m << "lamp::data::read_cifar10: " << (train ? "train" : "test")
    << " data not found in " << quoted(directory) << ": missing "
    << join(missing, ", ") << " (it looks for " << join(files, ", ") << "). "
    << describe_directory(directory) << ". ";
  // The Python version of the archive has pickled batches without ".bin"
  // and a pickled batches.meta (the binary one has batches.meta.txt).
  for (const auto& d :
       {directory, join_path(directory, "cifar-10-batches-py")}) {
    for (const char* name : {"data_batch_1", "test_batch", "batches.meta"}) {
      if (regular_file_exists(join_path(d, name))) {
        m << "Found " << quoted(join_path(d, name))
          << ": that is CIFAR-10's Python version (cifar-10-python.tar.gz, "
             "pickled batches), which lamp cannot read; it needs the binary "
             "version. ";
        break;
      }
    }
  }
  const auto extracted = join_path(directory, "cifar-10-batches-bin");
  if (directory_exists(extracted)) {
    m << "The extracted archive is in " << quoted(extracted)
      << ": pass that directory. ";
  }
  m << "Download the CIFAR-10 *binary* version, " << kCifarBinaryUrl
    << ", and extract it (tar xzf cifar-10-binary.tar.gz, which makes "
       "cifar-10-batches-bin/) so that the .bin files lie directly in the "
       "directory you pass.";
  return m.str();
}

std::vector<std::string> cifar10_names(bool train) {
  if (!train) {
    return {"test_batch.bin"};
  }
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) {
    names.push_back("data_batch_" + std::to_string(i) + ".bin");
  }
  return names;
}

} // namespace

int64_t Dataset::size() const {
  return labels.defined() ? labels.size(0) : 0;
}

std::vector<std::string> cifar10_files(const std::string& directory,
                                       bool train) {
  std::vector<std::string> files;
  for (const auto& name : cifar10_names(train)) {
    files.push_back(join_path(directory, name));
  }
  return files;
}

Dataset read_cifar10(const std::string& directory, bool train) {
  const char* caller = "lamp::data::read_cifar10";
  const auto names = cifar10_names(train);
  const auto files = cifar10_files(directory, train);
  std::vector<std::string> missing;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!regular_file_exists(files[i])) {
      missing.push_back(names[i]);
    }
  }
  TORCH_CHECK(missing.empty(),
              cifar_missing_message(directory, train, files, missing));

  std::vector<int64_t> records; // per file
  int64_t total_records = 0;
  uint64_t largest = 0;
  size_t largest_file = 0;
  for (const auto& f : files) {
    const uint64_t size = regular_file_size(f, caller);
    TORCH_CHECK(size > 0, caller, ": ", quoted(f),
                " is empty; extract cifar-10-binary.tar.gz (", kCifarBinaryUrl,
                ") again.");
    TORCH_CHECK(
        size % kCifarRecordBytes == 0, caller, ": ", quoted(f), " has ", size,
        " bytes, not a multiple of 3073 (1 label byte + 3072 pixel bytes per "
        "record), so it is not a CIFAR-10 binary batch",
        size % (kCifarRecordBytes + 1) == 0
            ? " (it is a multiple of 3074, CIFAR-100's record size, which "
              "lamp does not read)"
            : "",
        "; extract cifar-10-binary.tar.gz (", kCifarBinaryUrl, ") again.");
    if (size > largest) {
      largest = size;
      largest_file = records.size();
    }
    records.push_back(static_cast<int64_t>(size / kCifarRecordBytes));
    total_records += records.back();
  }
  // Before allocating: a sparse or corrupt file can claim any size.
  const auto total_bytes =
      static_cast<uint64_t>(total_records) * kCifarRecordBytes;
  TORCH_CHECK(total_bytes <= lamp::detail::physical_memory_bytes(), caller, ": ",
              quoted(files[largest_file]), " is ", byte_count(largest),
              " (the ", files.size(), " files hold ", byte_count(total_bytes),
              "), more than ", memory_text(),
              "; a CIFAR-10 batch is 30,730,000 bytes (10,000 records), so "
              "the file is corrupt or not a CIFAR-10 batch: extract "
              "cifar-10-binary.tar.gz (",
              kCifarBinaryUrl, ") again.");

  // All files into one buffer, then one pass to split labels from pixels.
  auto raw = torch::empty({total_records, kCifarRecordBytes}, torch::kUInt8);
  uint8_t* dst = raw.data_ptr<uint8_t>();
  for (size_t i = 0; i < files.size(); ++i) {
    const auto bytes = static_cast<uint64_t>(records[i] * kCifarRecordBytes);
    read_whole_file(files[i], bytes, dst, caller);
    dst += bytes;
  }

  auto labels = raw.select(1, 0).to(torch::kLong);
  const auto bad = (labels >= kCifarClasses).nonzero();
  if (bad.numel() > 0) {
    int64_t record = bad[0][0].item<int64_t>();
    const int64_t label = labels[record].item<int64_t>();
    size_t file = 0;
    while (record >= records[file]) {
      record -= records[file++];
    }
    TORCH_CHECK(false, caller, ": record ", record, " of ", quoted(files[file]),
                " (byte offset ", record * kCifarRecordBytes, ") has label ",
                label,
                ", but CIFAR-10's labels are 0-9; the file is corrupt or "
                "not a CIFAR-10 binary batch: extract cifar-10-binary.tar.gz (",
                kCifarBinaryUrl, ") again.");
  }
  auto images = raw.narrow(1, 1, kCifarImageBytes)
                    .reshape({total_records, 3, 32, 32})
                    .contiguous();
  return {std::move(images), std::move(labels)};
}

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
  TORCH_CHECK(size <= lamp::detail::physical_memory_bytes(), caller, ": ", quoted(path),
              " is a gzip file of ", byte_count(size), ", more than ",
              memory_text(),
              "; MNIST-format files are tens of megabytes, so this one is "
              "corrupt or not MNIST data.");
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
    if (regular_file_exists(plain)) {
      paths[i] = plain;
    } else if (regular_file_exists(gz)) {
      paths[i] = gz;
    } else {
      missing.push_back(names[i] + "[.gz]");
    }
  }
  TORCH_CHECK(missing.empty(), caller, ": ", (train ? "train" : "test"),
              " data not found in ", quoted(directory), ": missing ",
              join(missing, " and "), " (it looks for ", join(looked_for, ", "),
              "). ", describe_directory(directory),
              ". For Fashion-MNIST install Debian's dataset-fashion-mnist "
              "(apt-get install dataset-fashion-mnist, into ",
              kDebianFashionMnist,
              "); for MNIST put the four files of "
              "http://yann.lecun.com/exdb/mnist/ (gzipped or not) in the "
              "directory.");

  // Named copies: std::quoted's overload for a non-const string would win
  // over quoted() for the elements of `paths`.
  const std::string images_path = paths[0];
  const std::string labels_path = paths[1];
  auto images = read_idx(images_path);
  auto labels = read_idx(labels_path);
  TORCH_CHECK(images.dim() == 3, caller, ": ", quoted(images_path),
              " has sizes ", images.sizes(),
              "; an images file must be 3-dimensional [N, H, "
              "W] (idx3). Check that the files are not swapped.");
  TORCH_CHECK(labels.dim() == 1, caller, ": ", quoted(labels_path),
              " has sizes ", labels.sizes(),
              "; a labels file must be 1-dimensional [N] "
              "(idx1). Check that the files are not swapped.");
  TORCH_CHECK(images.size(0) == labels.size(0), caller, ": ",
              quoted(images_path), " holds ", images.size(0), " images but ",
              quoted(labels_path), " holds ", labels.size(0),
              " labels; the counts must match: use files of the same split "
              "and dataset.");
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

TensorImageDataset::TensorImageDataset(lamp::data::Dataset data,
                                       std::vector<double> mean,
                                       std::vector<double> std)
    : data_(std::move(data)) {
  const char* caller = "lamp::data::TensorImageDataset";
  const auto& images = data_.images;
  const auto& labels = data_.labels;
  TORCH_CHECK(images.defined() && labels.defined(), caller,
              ": the dataset's images or labels are undefined; pass what "
              "read_cifar10() or read_mnist() returns.");
  TORCH_CHECK(images.dim() == 4 && images.scalar_type() == torch::kUInt8,
              caller, ": images must be uint8 [N, C, H, W], got ",
              images.scalar_type(), " ", images.sizes(), ".");
  TORCH_CHECK(labels.dim() == 1 && labels.scalar_type() == torch::kLong, caller,
              ": labels must be int64 [N], got ", labels.scalar_type(), " ",
              labels.sizes(), "; convert them with .to(torch::kLong).");
  TORCH_CHECK(images.size(0) == labels.size(0), caller, ": ", images.size(0),
              " images but ", labels.size(0),
              " labels; the counts must match.");
  TORCH_CHECK(images.device().is_cpu() && labels.device().is_cpu(), caller,
              ": images and labels must be on the CPU (the DataLoader moves "
              "batches, not the dataset); got ",
              images.device(), " and ", labels.device(), ".");
  const int64_t channels = images.size(1);
  TORCH_CHECK(static_cast<int64_t>(mean.size()) == channels &&
                  static_cast<int64_t>(std.size()) == channels,
              caller, ": the images have ", channels,
              " channels, so mean and std need ", channels,
              " values each; got ", mean.size(), " and ", std.size(), ".");
  for (int64_t c = 0; c < channels; ++c) {
    TORCH_CHECK(std::isfinite(mean[c]), caller, ": mean[", c, "] is ", mean[c],
                "; it must be finite.");
    TORCH_CHECK(std::isfinite(std[c]) && std[c] > 0, caller, ": std[", c,
                "] is ", std[c], "; it must be finite and positive.");
  }
  mean_ = torch::from_blob(mean.data(), {channels, 1, 1}, torch::kDouble)
              .to(torch::kFloat);
  std_ = torch::from_blob(std.data(), {channels, 1, 1}, torch::kDouble)
             .to(torch::kFloat);
}

torch::data::Example<> TensorImageDataset::get(size_t index) {
  const int64_t n = data_.size();
  TORCH_CHECK(index < static_cast<size_t>(n),
              "lamp::data::TensorImageDataset::get: index ", index,
              " is out of range for a dataset of ", n, " examples.");
  const auto i = static_cast<int64_t>(index);
  auto image =
      data_.images[i].to(torch::kFloat).div_(255).sub_(mean_).div_(std_);
  return {std::move(image), data_.labels[i]};
}

c10::optional<size_t> TensorImageDataset::size() const {
  return static_cast<size_t>(data_.size());
}

} // namespace data
} // namespace lamp
