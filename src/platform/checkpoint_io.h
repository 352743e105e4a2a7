#pragma once

// What lamp's checkpoint readers share (src/platform/checkpoint_file.cpp:
// checked archives; src/platform/pickle_file.cpp: Python's pickles).

#include <string>

namespace lamp {
namespace detail {

// The whole of a regular file, checked against the memory there is to hold
// it; a TORCH_CHECK error naming the path otherwise.
std::string read_regular_file(const std::string& path);

} // namespace detail
} // namespace lamp
