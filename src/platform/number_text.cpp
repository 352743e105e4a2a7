#include "platform/number_text.h"

#include <charconv>
#include <string>
#include <system_error>

namespace lamp {
namespace detail {
namespace {

// std::to_chars writes what printf writes in the "C" locale, whatever locale
// the host program set: snprintf follows LC_NUMERIC ("0,4914" after
// setlocale(LC_ALL, "de_DE.UTF-8")), and these texts are stored in
// checkpoints and compared as text.
std::string general(double value, int digits) {
  char text[32];
  const auto written = std::to_chars(text, text + sizeof(text), value,
                                     std::chars_format::general, digits);
  return std::string(text, written.ptr);
}

} // namespace

std::string exact(double value) {
  // "%.15g", or "%.17g" where 15 digits do not read back as the value.
  std::string text = general(value, 15);
  double back = 0;
  const auto read =
      std::from_chars(text.data(), text.data() + text.size(), back);
  if (read.ec != std::errc() || back != value) {
    text = general(value, 17);
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
  char text[32];
  const auto written = std::to_chars(text, text + sizeof(text), value,
                                     std::chars_format::fixed, 1);
  return std::string(text, written.ptr) + " " + units[unit] + " (" +
         std::to_string(bytes) + " bytes)";
}

} // namespace detail
} // namespace lamp
