# cmake/ZestTorchNvtx.cmake against a stand-in libtorch whose TorchConfig
# searches NVTX3 as Caffe2's public/cuda.cmake of libtorch 2.x does (in its
# own source tree only, NO_DEFAULT_PATH) and fails where the real one falls
# back on CUDA::nvToolsExt, which CUDA 13 lacks. With ZestTorchNvtx the
# search is settled by the toolkit's headers (a stand-in toolkit here);
# without it the stand-in fails, as the real package would.
# Inputs: ZEST_CMAKE_DIR, PROJECT_DIR (torch_nvtx_project/), WORK_DIR, GENERATOR.
file(REMOVE_RECURSE ${WORK_DIR})
set(toolkit ${WORK_DIR}/cuda/include)
file(MAKE_DIRECTORY ${toolkit}/nvtx3 ${WORK_DIR}/torch/share/cmake/Torch)
file(WRITE ${toolkit}/nvtx3/nvToolsExt.h "")
file(WRITE ${WORK_DIR}/torch/share/cmake/Torch/TorchConfig.cmake [=[
find_path(nvtx3_dir NAMES nvtx3 PATHS "${PROJECT_SOURCE_DIR}/third_party/NVTX/c/include" NO_DEFAULT_PATH)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(nvtx3 DEFAULT_MSG nvtx3_dir)
if(NOT nvtx3_FOUND)
  message(FATAL_ERROR "stand-in libtorch: no NVTX3, and CUDA::nvToolsExt does not exist")
endif()
message(STATUS "stand-in libtorch: NVTX3 in ${nvtx3_dir}")
set(Torch_FOUND ON)
]=])

include(${CMAKE_CURRENT_LIST_DIR}/configure_check.cmake)
set(args -DZEST_CMAKE_DIR=${ZEST_CMAKE_DIR} -DTorch_DIR=${WORK_DIR}/torch/share/cmake/Torch
         -DCUDAToolkit_INCLUDE_DIRS=${toolkit})
configure_project(with_zest_nvtx 0 ${PROJECT_DIR} ${args})
expect(with_zest_nvtx "stand-in libtorch: NVTX3 in ${toolkit}")
configure_project(without 1 ${PROJECT_DIR} ${args} -DWITHOUT_ZEST_NVTX=ON)
expect(without "stand-in libtorch: no NVTX3")
