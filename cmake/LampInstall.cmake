include(CMakePackageConfigHelpers)

# Everything below belongs to the component "dev" (the library package,
# liblamp-dev) unless it names another; the programs are "tools".
set(CMAKE_INSTALL_DEFAULT_COMPONENT_NAME dev)

install(TARGETS lamp EXPORT lampTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/lamp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The SentencePiece module lamp opens on first use (CMakeLists.txt), where
# sentencepiece.cpp looks for it.
if(TARGET lamp_sentencepiece)
  install(TARGETS lamp_sentencepiece
          LIBRARY DESTINATION ${LAMP_SENTENCEPIECE_MODULE_DIR})
endif()

set(LAMP_CONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/lamp)
install(EXPORT lampTargets NAMESPACE lamp:: DESTINATION ${LAMP_CONFIG_DIR})
configure_package_config_file(cmake/lampConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/lampConfig.cmake
  INSTALL_DESTINATION ${LAMP_CONFIG_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/lampConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/lampConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/lampConfigVersion.cmake
  ${CMAKE_CURRENT_SOURCE_DIR}/cmake/LampTorchLinkDirs.cmake
  DESTINATION ${LAMP_CONFIG_DIR})

# pkg-config, for builds without CMake.
include(cmake/LampPkgConfig.cmake)
lamp_write_pkg_config(${CMAKE_CURRENT_BINARY_DIR}/lamp.pc)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/lamp.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The documents, with docs/ kept as a folder so that the links between
# README.md, CHANGELOG.md and docs/*.md still work. The guide's pages only
# (docs/api/ is Doxygen's input); a page added later is picked up when the
# build configures again, which it does by itself (CONFIGURE_DEPENDS).
file(GLOB _lamp_doc_pages CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/docs/*.md")
install(FILES LICENSE README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)
if(_lamp_doc_pages)
  install(FILES ${_lamp_doc_pages} DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
endif()

# The programs, component "tools" (the lamp-tools package). Where LibTorch is
# outside the system's folders (a torch wheel) the installed programs keep
# its folder as their RPATH; Debian's LibTorch needs none.
set(LAMP_INSTALLED_PROGRAMS "")
if(LAMP_BUILD_EXAMPLES)
  set(LAMP_INSTALLED_PROGRAMS train_mnist train_cifar10 train_gpt prepare_tokens
      lamp_bench)
  set_target_properties(${LAMP_INSTALLED_PROGRAMS} PROPERTIES
                        INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS ${LAMP_INSTALLED_PROGRAMS}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endif()

# cpack: Debian's liblamp-dev and lamp-tools packages, or a tarball.
include(cmake/LampPackaging.cmake)
