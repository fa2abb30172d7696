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
# Internal headers (used only inside the library; some include <mpi.h>) stay out.
set(_zest_layers core data memory nvme comm launch mesh optim config engine checkpoint hf estimate pipeline)
if(ZEST_TORCH)
  list(APPEND _zest_layers torch)
endif()
foreach(layer ${_zest_layers})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zest/${layer}
    FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh"
    PATTERN "mpi_poll.h" EXCLUDE
    PATTERN "aio_pieces.h" EXCLUDE
    PATTERN "nccl_watchdog.h" EXCLUDE
    PATTERN "pending_collectives.h" EXCLUDE
    PATTERN "reduce_element.h" EXCLUDE
    PATTERN "tcp_socket.h" EXCLUDE
    PATTERN "rendezvous_wire.h" EXCLUDE
    PATTERN "optimizer_impl.h" EXCLUDE
    PATTERN "lamb_impl.h" EXCLUDE
    PATTERN "host_convert.h" EXCLUDE
    PATTERN "engine_state.h" EXCLUDE
    PATTERN "optimizer_offload.h" EXCLUDE
    PATTERN "on_every_rank.h" EXCLUDE
    PATTERN "hf_progress.h" EXCLUDE
    PATTERN "json_parse.h" EXCLUDE
    PATTERN "config_reader.h" EXCLUDE
    PATTERN "config_sections.h" EXCLUDE
    PATTERN "optim_cuda.h" EXCLUDE
    PATTERN "dtype_dispatch.h" EXCLUDE
    PATTERN "cuda_elementwise.cuh" EXCLUDE)
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
