#include "lamp/version.h"

namespace lamp {

// Compiled into the library, so that it reports the headers the library was
// built with, not those a program includes.
const char* version() noexcept {
  return LAMP_VERSION;
}

} // namespace lamp
