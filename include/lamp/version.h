#pragma once

/// \file
/// lamp's version, the single place it is written. CMake reads it from here.

/// Major version of these headers (the X of X.Y.Z).
#define LAMP_VERSION_MAJOR 0
/// Minor version of these headers (the Y of X.Y.Z).
#define LAMP_VERSION_MINOR 5
/// Patch version of these headers (the Z of X.Y.Z).
#define LAMP_VERSION_PATCH 0

/// The version as one number, MAJOR * 10000 + MINOR * 100 + PATCH (0.4.0 is
/// 400), for preprocessor comparisons: `#if LAMP_VERSION_NUMBER >= 400`.
#define LAMP_VERSION_NUMBER \
  (LAMP_VERSION_MAJOR * 10000 + LAMP_VERSION_MINOR * 100 + LAMP_VERSION_PATCH)

/// `x` as a string literal, unexpanded; LAMP_STRINGIFY() expands it first.
#define LAMP_STRINGIFY_IMPL(x) #x
/// `x`, macro-expanded, as a string literal:
/// `LAMP_STRINGIFY(LAMP_VERSION_MAJOR)` is "0" where LAMP_VERSION_MAJOR is 0.
#define LAMP_STRINGIFY(x) LAMP_STRINGIFY_IMPL(x)
/// The version as a string literal, "MAJOR.MINOR.PATCH", of these headers.
#define LAMP_VERSION                 \
  LAMP_STRINGIFY(LAMP_VERSION_MAJOR) \
  "." LAMP_STRINGIFY(LAMP_VERSION_MINOR) "." LAMP_STRINGIFY(LAMP_VERSION_PATCH)

namespace lamp {

/// The version of the lamp library this program is linked with,
/// "MAJOR.MINOR.PATCH". `LAMP_VERSION` is the version of the headers it was
/// compiled with; the two differ when headers and library come from different
/// installs, which the linker does not notice.
///
/// Example:
/// ```
///   TORCH_CHECK(std::string(lamp::version()) == LAMP_VERSION,
///               "lamp headers ", LAMP_VERSION, " but library ",
///               lamp::version());
/// ```
const char* version() noexcept;

} // namespace lamp
