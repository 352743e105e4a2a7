# Read by cpack for each generator (CPACK_PROJECT_CONFIG_FILE): refuses the
# Debian package of a lamp built with a LibTorch that no Debian package holds.
# For the .debs, the summary is CPack's default, which its DEB generator does
# not put before a component's description: each package's description
# (LampPackaging.cmake) starts with its own summary line.
if(CPACK_GENERATOR STREQUAL "DEB")
  set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${CPACK_DEFAULT_PACKAGE_DESCRIPTION_SUMMARY}")
endif()
if(CPACK_GENERATOR STREQUAL "DEB" AND NOT CPACK_LAMP_DEB_REFUSED STREQUAL "")
  message(FATAL_ERROR "${CPACK_LAMP_DEB_REFUSED}")
endif()
