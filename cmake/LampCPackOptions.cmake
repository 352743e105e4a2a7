# Read by cpack for each generator (CPACK_PROJECT_CONFIG_FILE): refuses the
# Debian package of a lamp built with a LibTorch that no Debian package holds.
if(CPACK_GENERATOR STREQUAL "DEB" AND NOT CPACK_LAMP_DEB_REFUSED STREQUAL "")
  message(FATAL_ERROR "${CPACK_LAMP_DEB_REFUSED}")
endif()
