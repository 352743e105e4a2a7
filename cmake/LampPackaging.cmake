# Packages of lamp's install tree, made with cpack in the build folder:
#
#   cpack -G DEB   two Debian packages (components of the install):
#                  liblamp-dev_<version>_<arch>.deb (component dev): headers,
#                  library, CMake package and lamp.pc, depending on the
#                  Debian package of the LibTorch lamp was built with;
#                  lamp-tools_<version>_<arch>.deb (component tools, where the
#                  programs are built): train_mnist, train_cifar10 and
#                  lamp_bench, depending on the shared libraries they load
#                  (dpkg-shlibdeps: LibTorch's runtime package, not its -dev
#                  one), so that running the programs needs no headers or
#                  compiler and linking lamp installs no programs. Only for a
#                  lamp built with Debian's LibTorch: a .deb cannot depend on
#                  a torch wheel, and the lamp inside it, compiled against
#                  that wheel's headers and recording its folder, would not
#                  work with Debian's, so cpack refuses with a message.
#   cpack -G TGZ   one tarball of the whole tree, for any LibTorch (the
#                  default).
#
#   LAMP_PACKAGE_MAINTAINER  Maintainer of the .debs ("Name <address>"):
#                            by default the packager, as Debian's tools find
#                            them: DEBFULLNAME and DEBEMAIL, else the source
#                            checkout's git user.name and user.email, else
#                            the user at this host (USER, LOGNAME or
#                            `id -un`)
#   LAMP_HOMEPAGE_URL        Homepage of the packages; empty (the default): no
#                            Homepage field

# lamp_default_maintainer(<var>): the packager's "Name <address>".
function(lamp_default_maintainer out)
  set(_name "$ENV{DEBFULLNAME}")
  set(_email "$ENV{DEBEMAIL}")
  # DEBEMAIL may hold "Name <address>" (devscripts takes it so): its name
  # where DEBFULLNAME gives none, and its address.
  if(_email MATCHES "^(.*[^ ]) *<([^<>]+)>$")
    if(_name STREQUAL "")
      set(_name "${CMAKE_MATCH_1}")
    endif()
    set(_email "${CMAKE_MATCH_2}")
  endif()
  find_program(LAMP_GIT git)
  mark_as_advanced(LAMP_GIT)
  foreach(_field name email)
    if("${_${_field}}" STREQUAL "" AND LAMP_GIT)
      execute_process(COMMAND "${LAMP_GIT}" config "user.${_field}"
                      WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
                      OUTPUT_VARIABLE "_${_field}" OUTPUT_STRIP_TRAILING_WHITESPACE
                      ERROR_QUIET)
    endif()
  endforeach()
  # What the environment gives must make a Maintainer field; else the
  # account's, so that no setting of it stops the configure (only a
  # LAMP_PACKAGE_MAINTAINER given so does).
  if(NOT "${_name} <${_email}>" MATCHES "^[^<>]+ <[^<> ]+@[^<> ]+>$")
    set(_name "")
  endif()
  if("${_name}" STREQUAL "" OR "${_email}" STREQUAL "")
    cmake_host_system_information(RESULT _host QUERY FQDN)
    set(_user "$ENV{USER}")
    if(_user STREQUAL "")
      set(_user "$ENV{LOGNAME}")
    endif()
    # Containers and CI shells often set neither (nor a git identity): the
    # account's name, else a placeholder, never an empty field that stops
    # the configure.
    if(_user STREQUAL "")
      execute_process(COMMAND id -un OUTPUT_VARIABLE _user
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
    if(_user STREQUAL "")
      set(_user "packager")
    endif()
    set(_name "${_user}")
    set(_email "${_user}@${_host}")
  endif()
  set(${out} "${_name} <${_email}>" PARENT_SCOPE)
endfunction()

# LAMP_PACKAGE_CONTACT was the option's name in lamp 0.3; a value given
# for it (other than its old placeholder) still counts.
if(DEFINED LAMP_PACKAGE_CONTACT AND
   NOT LAMP_PACKAGE_CONTACT STREQUAL "lamp authors <lamp@example.org>")
  set(_lamp_maintainer "${LAMP_PACKAGE_CONTACT}")
else()
  lamp_default_maintainer(_lamp_maintainer)
endif()
set(LAMP_PACKAGE_MAINTAINER "${_lamp_maintainer}" CACHE STRING
    "Maintainer field of lamp's Debian packages: \"Name <address>\"")
if(NOT LAMP_PACKAGE_MAINTAINER MATCHES "^[^<>]+ <[^<> ]+@[^<> ]+>$")
  message(FATAL_ERROR "LAMP_PACKAGE_MAINTAINER is '${LAMP_PACKAGE_MAINTAINER}'; "
                      "give \"Name <address>\", e.g. -DLAMP_PACKAGE_MAINTAINER="
                      "\"Jane Doe <jane@example.net>\"")
endif()
message(STATUS "lamp: Debian packages' maintainer: ${LAMP_PACKAGE_MAINTAINER} "
               "(LAMP_PACKAGE_MAINTAINER)")
set(LAMP_HOMEPAGE_URL "" CACHE STRING
    "Homepage field of lamp's packages")

set(CPACK_PACKAGE_NAME lamp)
set(CPACK_PACKAGE_VENDOR "the lamp authors")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "${LAMP_PACKAGE_MAINTAINER}")
if(LAMP_HOMEPAGE_URL)
  set(CPACK_PACKAGE_HOMEPAGE_URL "${LAMP_HOMEPAGE_URL}")
endif()
# Each package's description starts with its own summary line; for the .debs
# LampCPackOptions.cmake keeps cpack from putting this project-wide summary
# before both.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
get_target_property(_lamp_type lamp TYPE)
if(_lamp_type STREQUAL "SHARED_LIBRARY")
  set(_lamp_kind "shared")
else()
  set(_lamp_kind "static")
endif()
# Lines as the .deb shows them (cpack indents each).
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "LibTorch Automatic Mixed Precision (C++ development files)\n"
  "lamp gives C++ programs built on LibTorch the mixed-precision tools of\n"
  "Python's torch.amp, NVIDIA Apex and fastai: a dynamic gradient scaler, an\n"
  "autocast guard, network_to_half with FP32 BatchNorm, FP32 master weights\n"
  "and a training step for seven precision modes.\n"
  "This package holds the headers, the ${_lamp_kind} library, the CMake package\n"
  "(find_package(lamp), target lamp::lamp) and lamp.pc for pkg-config,\n"
  "built for LibTorch ${LAMP_TORCH_VERSION}.")
set(CPACK_COMPONENT_DEV_DESCRIPTION "${CPACK_PACKAGE_DESCRIPTION}")
string(CONCAT CPACK_COMPONENT_TOOLS_DESCRIPTION
  "LibTorch Automatic Mixed Precision (training and benchmark programs)\n"
  "lamp's programs: train_mnist and train_cifar10 train a CNN or a ResNet,\n"
  "train_gpt a GPT on a text or on token files, in fp32, tf32, amp, amp-bf16,\n"
  "half, bf16, fp8 or the mode the hardware suits, with checkpoints, JSON logs\n"
  "and data-parallel training under torchrun; prepare_tokens encodes a text\n"
  "or JSON Lines into token files for train_gpt; lamp_bench measures a\n"
  "training step's throughput in every mode.\n"
  "Built for LibTorch ${LAMP_TORCH_VERSION}.")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_GENERATOR TGZ)
set(CPACK_PACKAGE_FILE_NAME "lamp-${PROJECT_VERSION}-${CMAKE_SYSTEM_NAME}-${CMAKE_SYSTEM_PROCESSOR}")

# The programs lamp-tools holds (tests/packaging/deb.cmake reads them).
set(CPACK_LAMP_TOOLS "${LAMP_INSTALLED_PROGRAMS}")
# Whether liblamp-dev holds the SentencePiece module and depends on
# libsentencepiece0 (tests/packaging/deb.cmake).
set(CPACK_LAMP_WITH_SENTENCEPIECE "${LAMP_SENTENCEPIECE_FOUND}")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL dev)
if(LAMP_INSTALLED_PROGRAMS)
  list(APPEND CPACK_COMPONENTS_ALL tools)
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_NAME liblamp-dev)
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME lamp-tools)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION science)
# lamp-tools: the libraries the programs load (LibTorch's runtime package,
# libc, libstdc++ ...), as dpkg-shlibdeps reads them from the binaries; the
# data train_mnist reads by default is a suggestion.
set(CPACK_DEBIAN_TOOLS_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SUGGESTS "dataset-fashion-mnist, fortunes")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${LAMP_PACKAGE_MAINTAINER}")
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
# libsentencepiece0 where lamp has its tokenizer: the SentencePiece module
# liblamp-dev installs links it (lamp itself does not). libicu-dev where
# lamp splits text with ICU: lampConfig.cmake's find_dependency(ICU) and
# the consumer's -licuuc need it. libzstd-dev where lamp reads zstd text: a
# static lamp is linked with -lzstd in the consumer's build.
# lamp's public headers include LibTorch's alone.
set(CPACK_LAMP_DEB_REFUSED "")
if(LAMP_TORCH_PACKAGE MATCHES "^([^ ]+) ([0-9]+:)?([0-9]+)\\.([0-9]+)(\\.[0-9]+)?")
  set(_lamp_torch_deb "${CMAKE_MATCH_1}")
  set(_lamp_torch_from "${CMAKE_MATCH_3}.${CMAKE_MATCH_4}${CMAKE_MATCH_5}")
  math(EXPR _lamp_torch_next_minor "${CMAKE_MATCH_4} + 1")
  set(_lamp_torch_below "${CMAKE_MATCH_3}.${_lamp_torch_next_minor}~")
  set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
      "${_lamp_torch_deb} (>= ${_lamp_torch_from}), ${_lamp_torch_deb} (<< ${_lamp_torch_below}), zlib1g-dev")
  if(LAMP_SENTENCEPIECE_FOUND)
    string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libsentencepiece0")
  endif()
  if(LAMP_ICU_FOUND)
    string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libicu-dev")
  endif()
  if(LAMP_ZSTD_FOUND)
    string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libzstd-dev")
  endif()
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
