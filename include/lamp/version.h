#pragma once

/// lamp's version, the single place it is written. CMake reads it from here.
#define LAMP_VERSION_MAJOR 0
#define LAMP_VERSION_MINOR 2
#define LAMP_VERSION_PATCH 0

#define LAMP_STRINGIFY_IMPL(x) #x
#define LAMP_STRINGIFY(x) LAMP_STRINGIFY_IMPL(x)
#define LAMP_VERSION                 \
  LAMP_STRINGIFY(LAMP_VERSION_MAJOR) \
  "." LAMP_STRINGIFY(LAMP_VERSION_MINOR) "." LAMP_STRINGIFY(LAMP_VERSION_PATCH)
