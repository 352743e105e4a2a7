#pragma once

// File and message helpers of lamp's dataset readers (internal): paths,
// sizes and whole-file reads through POSIX calls, and the quoting and byte
// counts their messages use.

#include <cstdint>
#include <string>
#include <vector>

#include "platform/number_text.h"
#include "platform/paths.h"

namespace lamp {
namespace data {
namespace internal {

std::string quoted(const std::string& s);
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

} // namespace internal
} // namespace data
} // namespace lamp
