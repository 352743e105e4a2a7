#pragma once

// File and message helpers of lamp's dataset readers (internal): paths,
// sizes and whole-file reads through POSIX calls, and the quoting and byte
// counts their messages use.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "platform/number_text.h"
#include "platform/paths.h"

namespace lamp {
namespace data {
namespace internal {

std::string quoted(const std::string& s);
// The largest context a language model's windows take: 2^40 tokens, far
// beyond any model's, so that context + 1 and the sizes made of it never
// overflow int64.
constexpr int64_t kMostContext = int64_t{1} << 40;
// Throws naming `caller` unless 1 <= context <= kMostContext.
void check_context(int64_t context, const char* caller);
// For a string that is not const, which would otherwise call <iomanip>'s
// std::quoted (found by argument-dependent lookup, and the better match for
// a non-const reference): that one writes "s", in double quotes.
inline std::string quoted(std::string& s) {
  return quoted(static_cast<const std::string&>(s));
}
std::string join(const std::vector<std::string>& items,
                 const std::string& separator);
std::string hex_byte(uint8_t b);
// "1.5 GiB (1610612736 bytes)": platform/number_text.h.
using ::lamp::detail::byte_count;
// "this machine's 23.4 GiB (...) of memory".
std::string memory_text();

// Paths and file kinds: platform/paths.h.
using ::lamp::detail::directory_exists;
using ::lamp::detail::join_path;
using ::lamp::detail::path_kind;
using ::lamp::detail::PathKind;
using ::lamp::detail::regular_file_exists;
// "'dir' holds a, b, c": what a directory does hold, for "file not found"
// messages (the usual mistake is one directory level too high or too low).
std::string describe_directory(const std::string& directory);
// Throws, naming `path` and `fix`, where something other than a regular
// file (a folder, a device, a pipe) is at `path`: the readers' "missing"
// would otherwise name a file their folder listing shows.
void refuse_non_file(const std::string& path, const char* caller,
                     const std::string& fix);
// The size of the regular file at `path`; a clear error when there is none.
uint64_t regular_file_size(const std::string& path, const char* caller);
// Reads the first `size` bytes of `path` (all of it when `size` is the size
// measured before) into `dst` in one read.
void read_whole_file(const std::string& path, uint64_t size, uint8_t* dst,
                     const char* caller);
// The first `size` bytes of `path`.
std::vector<uint8_t> read_file_bytes(const std::string& path, uint64_t size,
                                     const char* caller);
// The whole of a small regular file (meta.pkl, a tokenizer's files), as
// bytes in a string.
std::string read_small_file(const std::string& path, const char* caller);

// The text files of `folder`, in name order: regular files (not symbolic
// links), not hidden, not `fortune`'s index files (*.dat); subfolders not
// entered. Throws naming the folder when it cannot be listed.
std::vector<std::string> text_files(const std::string& folder,
                                    const char* caller);

// The files of a text input `path`: the file itself, or a folder's
// text_files(). Throws naming the path and the fix when it is empty,
// missing, neither a file nor a folder, or a folder without a text file.
std::vector<std::string> text_input_files(const std::string& path,
                                          const char* caller);

// Where a text of `n` bytes splits into training and validation parts, by
// bytes: floor((1 - validation_fraction) n), before split_at_character().
int64_t text_split_byte(int64_t n, double validation_fraction);
// `split` moved forward to the start of a UTF-8 character, over at most 3
// continuation bytes (past them the text is not UTF-8 there, and any point
// is as good as another). `bytes` holds the text's `available` bytes from
// `split` on.
int64_t split_at_character(int64_t split, const uint8_t* bytes,
                           size_t available);

// Checks a file's bytes as text, a block at a time (read_text_bytes()'s
// rule): add() throws at a NUL byte, finish() where more than 10% of the
// bytes are control characters other than tab, newline, carriage return
// and form feed; each names the file, the offset and the fix.
class TextCheck {
 public:
  TextCheck(std::string path, const char* caller)
      : path_(std::move(path)), caller_(caller) {}
  void add(const uint8_t* data, size_t size);
  void finish() const;

 private:
  std::string path_;
  const char* caller_;
  int64_t bytes_ = 0;
  int64_t control_ = 0;
  int64_t first_control_ = -1;
};

} // namespace internal
} // namespace data
} // namespace lamp
