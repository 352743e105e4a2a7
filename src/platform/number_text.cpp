#include "platform/number_text.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace lamp {
namespace detail {

std::string exact(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.15g", value);
  if (std::strtod(text, nullptr) != value) {
    std::snprintf(text, sizeof(text), "%.17g", value);
  }
  return text;
}

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

} // namespace detail
} // namespace lamp
