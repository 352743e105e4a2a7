#include "platform/number_text.h"

#include <cstdio>
#include <cstdlib>

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

} // namespace detail
} // namespace lamp
