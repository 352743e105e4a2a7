#include "data/files.h"

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

#include "lamp/platform/out_of_memory.h"
#include "platform/memory.h"

namespace lamp {
namespace data {
namespace internal {

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

void check_context(int64_t context, const char* caller) {
  TORCH_CHECK(context >= 1 && context <= kMostContext, caller,
              ": context must be in 1 ... 2^40, got ", context, ".");
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

// "this machine's 23.4 GiB (...) of memory".
std::string memory_text() {
  return "this machine's " + byte_count(lamp::detail::physical_memory_bytes()) +
         " of memory";
}

// "'dir' holds a, b, c": what a directory does hold, for "file not found"
// messages (the usual mistake is one directory level too high or too low).
std::string describe_directory(const std::string& directory) {
  if (!directory_exists(directory)) {
    if (regular_file_exists(directory)) {
      return quoted(directory) +
             " is a file, not a directory: pass the directory that holds the "
             "data files (extract an archive first)";
    }
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
void refuse_non_file(const std::string& path, const char* caller,
                     const std::string& fix) {
  const PathKind kind = path_kind(path);
  TORCH_CHECK(
      kind == PathKind::kFile || kind == PathKind::kMissing, caller, ": ",
      quoted(path),
      kind == PathKind::kDirectory ? " is a folder" : " is not a regular file",
      ", not the data file of that name; ", fix, ".");
}

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
  auto bytes = with_memory_context(
      "the contents of " + quoted(path), static_cast<int64_t>(size),
      [&] { return std::vector<uint8_t>(static_cast<size_t>(size)); });
  read_whole_file(path, size, bytes.data(), caller);
  return bytes;
}

std::string read_small_file(const std::string& path, const char* caller) {
  const auto bytes =
      read_file_bytes(path, regular_file_size(path, caller), caller);
  return std::string(bytes.begin(), bytes.end());
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() &&
         s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

} // namespace

std::vector<std::string> text_files(const std::string& folder,
                                    const char* caller) {
  DIR* dir = ::opendir(folder.c_str());
  TORCH_CHECK(dir != nullptr, caller, ": cannot list the folder ",
              quoted(folder), "; check its permissions.");
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat")) {
      continue;
    }
    struct stat info {};
    const auto path = join_path(folder, name);
    if (::lstat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
      names.push_back(path);
    }
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> text_input_files(const std::string& path,
                                          const char* caller) {
  TORCH_CHECK(!path.empty(), caller,
              ": the path is empty; give a text file or a folder of them.");
  const auto kind = path_kind(path);
  TORCH_CHECK(kind != PathKind::kMissing, caller, ": ", quoted(path),
              " does not exist; give a text file or a folder of them.");
  TORCH_CHECK(kind != PathKind::kOther, caller, ": ", quoted(path),
              " is neither a file nor a folder; give a text file or a "
              "folder of them.");
  if (kind != PathKind::kDirectory) {
    return {path};
  }
  auto files = text_files(path, caller);
  TORCH_CHECK(!files.empty(), caller, ": the folder ", quoted(path),
              " holds no text file (regular files, not *.dat); give a text "
              "file or a folder of them.");
  return files;
}

int64_t text_split_byte(int64_t n, double validation_fraction) {
  return static_cast<int64_t>(
      std::floor((1.0 - validation_fraction) * static_cast<double>(n)));
}

int64_t split_at_character(int64_t split, const uint8_t* bytes,
                           size_t available) {
  for (size_t k = 0; k < 3 && k < available && (bytes[k] & 0xC0) == 0x80; ++k) {
    ++split;
  }
  return split;
}

void TextCheck::add(const uint8_t* data, size_t size) {
  for (size_t i = 0; i < size; ++i) {
    const uint8_t b = data[i];
    TORCH_CHECK(b != 0, caller_, ": ", quoted(path_),
                " looks binary (a NUL byte at offset ",
                bytes_ + static_cast<int64_t>(i),
                "); give a text file (UTF-8 or other byte text).");
    if (b < 0x20 && b != '\t' && b != '\n' && b != '\r' && b != '\f') {
      if (first_control_ < 0) {
        first_control_ = bytes_ + static_cast<int64_t>(i);
      }
      ++control_;
    }
  }
  bytes_ += static_cast<int64_t>(size);
}

void TextCheck::finish() const {
  TORCH_CHECK(control_ * 10 <= bytes_, caller_, ": ", quoted(path_),
              " looks binary (", control_, " of ", bytes_,
              " bytes are control characters, the first at offset ",
              first_control_,
              "); give a text file (UTF-8 or other byte text).");
}

} // namespace internal
} // namespace data
} // namespace lamp
