# NCCL ships with the CUDA toolkit here but has no CMake package: make an
# imported target zest::nccl from the header and library next to cudart.
# Installed consumers get the same target from zestConfig.cmake, which
# includes this file.
if(NOT TARGET zest::nccl)
  find_path(ZEST_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(ZEST_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NOT ZEST_NCCL_INCLUDE_DIR OR NOT ZEST_NCCL_LIBRARY)
    message(FATAL_ERROR "NCCL not found next to the CUDA toolkit (looked for nccl.h and libnccl); "
                        "install NCCL or configure with -DZEST_CUDA=OFF")
  endif()
  add_library(zest::nccl UNKNOWN IMPORTED)
  set_target_properties(zest::nccl PROPERTIES
    IMPORTED_LOCATION ${ZEST_NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${ZEST_NCCL_INCLUDE_DIR})
endif()
