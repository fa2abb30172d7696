# Install rules and the exported package: find_package(zest) then link zest::zest.
include(CMakePackageConfigHelpers)

set(_zest_install_targets zest)
if(ZEST_TORCH)
  list(APPEND _zest_install_targets zest_torch)
endif()
install(TARGETS ${_zest_install_targets} EXPORT zestTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Every header of a layer but those under its detail/ folders, which are
# internal (included only by the library's own sources and other detail
# headers; tests/layering checks that no installed header includes one).
set(_zest_layers core data tokenizer memory nvme comm launch mesh optim config engine checkpoint hf estimate pipeline)
if(ZEST_TORCH)
  list(APPEND _zest_layers torch)
endif()
foreach(layer ${_zest_layers})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zest/${layer}
    FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh"
    PATTERN "detail" EXCLUDE)
endforeach()
install(FILES ${ZEST_INCLUDE_ROOT}/zest_generated/build_config.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zest_generated)

install(EXPORT zestTargets NAMESPACE zest:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zest)
configure_package_config_file(cmake/zestConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/zestConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zest)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/zestConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/zestConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/zestConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/ZestFindNccl.cmake
              ${PROJECT_SOURCE_DIR}/cmake/ZestTorchNvtx.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zest)
