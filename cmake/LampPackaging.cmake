# Packages of lamp's install tree, made with cpack in the build folder:
#
#   cpack -G DEB   liblamp-dev_<version>_<arch>.deb: headers, library,
#                  CMake package and lamp.pc, depending on the Debian package
#                  of the LibTorch lamp was built with. Only for a lamp built
#                  with Debian's LibTorch: a .deb cannot depend on a torch
#                  wheel, and the lamp inside it, compiled against that
#                  wheel's headers and recording its folder, would not work
#                  with Debian's, so cpack refuses with a message.
#   cpack -G TGZ   a tarball of the same tree, for any LibTorch (the default).
#
#   LAMP_PACKAGE_CONTACT  Maintainer of the .deb ("Name <address>"); dpkg
#                         requires one, and the default is a placeholder
#                         (example.org): set the packager's own to publish
#   LAMP_HOMEPAGE_URL     Homepage of the packages; empty (the default): no
#                         Homepage field

set(LAMP_PACKAGE_CONTACT "lamp authors <lamp@example.org>" CACHE STRING
    "Maintainer field of lamp's Debian package: \"Name <address>\"")
set(LAMP_HOMEPAGE_URL "" CACHE STRING
    "Homepage field of lamp's packages")

set(CPACK_PACKAGE_NAME lamp)
set(CPACK_PACKAGE_VENDOR "the lamp authors")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "${LAMP_PACKAGE_CONTACT}")
if(LAMP_HOMEPAGE_URL)
  set(CPACK_PACKAGE_HOMEPAGE_URL "${LAMP_HOMEPAGE_URL}")
endif()
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "LibTorch Automatic Mixed Precision (C++ development files)")
get_target_property(_lamp_type lamp TYPE)
if(_lamp_type STREQUAL "SHARED_LIBRARY")
  set(_lamp_kind "shared")
else()
  set(_lamp_kind "static")
endif()
# Lines as the .deb shows them (cpack indents each).
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "lamp gives C++ programs built on LibTorch the mixed-precision tools of\n"
  "Python's torch.amp, NVIDIA Apex and fastai: a dynamic gradient scaler, an\n"
  "autocast guard, network_to_half with FP32 BatchNorm, FP32 master weights\n"
  "and a training step for six precision modes.\n"
  "This package holds the headers, the ${_lamp_kind} library, the CMake package\n"
  "(find_package(lamp), target lamp::lamp) and lamp.pc for pkg-config,\n"
  "built for LibTorch ${LAMP_TORCH_VERSION}.")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_GENERATOR TGZ)
set(CPACK_PACKAGE_FILE_NAME "lamp-${PROJECT_VERSION}-${CMAKE_SYSTEM_NAME}-${CMAKE_SYSTEM_PROCESSOR}")

set(CPACK_DEBIAN_PACKAGE_NAME liblamp-dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${LAMP_PACKAGE_CONTACT}")
if(LAMP_HOMEPAGE_URL)
  set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${LAMP_HOMEPAGE_URL}")
endif()
find_program(LAMP_DPKG dpkg DOC "dpkg, for the architecture of lamp's Debian package")
mark_as_advanced(LAMP_DPKG)
if(LAMP_DPKG)
  execute_process(COMMAND "${LAMP_DPKG}" --print-architecture
                  OUTPUT_VARIABLE _lamp_deb_arch OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET)
  if(_lamp_deb_arch)
    set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE "${_lamp_deb_arch}")
  endif()
endif()

# Depends: the Debian package of this LibTorch (LampTorchInfo.cmake), from its
# upstream version up to the next minor one: lamp is compiled against its
# headers and lampConfig.cmake refuses another LibTorch version. zlib1g-dev,
# not zlib1g: lampConfig.cmake's find_dependency(ZLIB) needs zlib.h and
# libz.so, and a static lamp is linked with -lz in the consumer's build.
# lamp's public headers include LibTorch's alone.
set(CPACK_LAMP_DEB_REFUSED "")
if(LAMP_TORCH_PACKAGE MATCHES "^([^ ]+) ([0-9]+:)?([0-9]+)\\.([0-9]+)(\\.[0-9]+)?")
  set(_lamp_torch_deb "${CMAKE_MATCH_1}")
  set(_lamp_torch_from "${CMAKE_MATCH_3}.${CMAKE_MATCH_4}${CMAKE_MATCH_5}")
  math(EXPR _lamp_torch_next_minor "${CMAKE_MATCH_4} + 1")
  set(_lamp_torch_below "${CMAKE_MATCH_3}.${_lamp_torch_next_minor}~")
  set(CPACK_DEBIAN_PACKAGE_DEPENDS
      "${_lamp_torch_deb} (>= ${_lamp_torch_from}), ${_lamp_torch_deb} (<< ${_lamp_torch_below}), zlib1g-dev")
else()
  string(CONCAT CPACK_LAMP_DEB_REFUSED
    "lamp: no Debian package: this lamp was built with the LibTorch at "
    "${LAMP_TORCH_REALPATH}, which no Debian package installed (a torch "
    "wheel?), and liblamp-dev must depend on the package of its LibTorch. "
    "Build lamp with Debian's LibTorch (apt-get install libtorch-dev; "
    "configure without the wheel in CMAKE_PREFIX_PATH) to make the .deb, or "
    "use cpack -G TGZ for a tarball.")
endif()
set(CPACK_PROJECT_CONFIG_FILE "${PROJECT_SOURCE_DIR}/cmake/LampCPackOptions.cmake")

include(CPack)
