# Included before find_package(Torch), by ZEST's build and by zestConfig.cmake.
# A CUDA libtorch's CMake package (Caffe2's public/cuda.cmake) looks for the
# NVTX3 headers in libtorch's own source tree (third_party/NVTX, which a
# wheel or a libtorch archive does not have), in some versions in the CUDA
# toolkit with USE_SYSTEM_NVTX, and otherwise falls back on
# CUDA::nvToolsExt, which CUDA 12.9 and later no longer ship: the configure
# or the link then fails. Its search keeps a cached nvtx3_dir, so pointing
# that at the toolkit's NVTX3 headers (include/nvtx3) first settles it for
# every version. A CPU libtorch never reads it.
if(NOT nvtx3_dir)
  set(_zest_cuda_includes ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(_zest_nvcc_dir ${CMAKE_CUDA_COMPILER} DIRECTORY)
    list(PREPEND _zest_cuda_includes ${_zest_nvcc_dir}/../include)
  endif()
  find_path(nvtx3_dir NAMES nvtx3/nvToolsExt.h HINTS ${_zest_cuda_includes} NO_DEFAULT_PATH)
  if(NOT nvtx3_dir)
    unset(nvtx3_dir CACHE)  # libtorch's own search then runs as it would
  endif()
endif()
