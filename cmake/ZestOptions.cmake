# Build switches. ZEST_CUDA and ZEST_MPI default to AUTO: on when the toolchain
# is found, off (with a status line saying so) when it is not. Asking for ON
# where the toolchain is missing is a configure error, never a silent downgrade.
include(CheckLanguage)

set(ZEST_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE ZEST_CUDA PROPERTY STRINGS AUTO ON OFF)
set(ZEST_MPI AUTO CACHE STRING "Build the MPI backend: AUTO, ON or OFF")
set_property(CACHE ZEST_MPI PROPERTY STRINGS AUTO ON OFF)
set(ZEST_TORCH AUTO CACHE STRING "Build the libtorch layer (zest::torch): AUTO, ON or OFF")
set_property(CACHE ZEST_TORCH PROPERTY STRINGS AUTO ON OFF)
option(ZEST_BUILD_TESTS "Build the tests" ${PROJECT_IS_TOP_LEVEL})
option(ZEST_BUILD_EXTRAS "Build examples, benchmarks and tools" ${PROJECT_IS_TOP_LEVEL})
option(ZEST_WERROR "Treat compiler warnings as errors" OFF)
# io_uring (liburing) for the NVMe tier (nvme/): AUTO uses it when found;
# without it the tier's thread pool (pread/pwrite) serves alone.
set(ZEST_IO_URING AUTO CACHE STRING "Build the NVMe tier's io_uring back end (liburing): AUTO, ON or OFF")
set_property(CACHE ZEST_IO_URING PROPERTY STRINGS AUTO ON OFF)
# SentencePiece (libsentencepiece-dev) for tokenizer/: AUTO uses it when
# found; without it text JSONL is refused by name (pre-tokenized data works).
set(ZEST_SENTENCEPIECE AUTO CACHE STRING "Build the SentencePiece tokenizer (tokenizer/): AUTO, ON or OFF")
set_property(CACHE ZEST_SENTENCEPIECE PROPERTY STRINGS AUTO ON OFF)
set(ZEST_SANITIZE "" CACHE STRING "Sanitizers for host code, e.g. address,undefined")

function(_zest_resolve_switch name found)
  string(TOUPPER "${${name}}" value)
  if(value STREQUAL "AUTO")
    set(${name} ${found} PARENT_SCOPE)
  elseif(value)
    if(NOT found)
      message(FATAL_ERROR "${name}=ON but the toolchain was not found; install it or configure with -D${name}=OFF")
    endif()
    set(${name} ON PARENT_SCOPE)
  else()
    set(${name} OFF PARENT_SCOPE)
  endif()
endfunction()

# CUDA: look at /usr/local/cuda when nvcc is not already on the PATH.
string(TOUPPER "${ZEST_CUDA}" _zest_cuda_request)
set(_zest_cuda_found OFF)
if(NOT _zest_cuda_request STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_zest_cuda_found ON)
  endif()
endif()
_zest_resolve_switch(ZEST_CUDA ${_zest_cuda_found})
if(ZEST_CUDA)
  # Machine code for Ampere and Ada (sm_80 runs on 8.x) and Hopper, and
  # Hopper's PTX for later GPUs to compile at load: a kernel built for 9.0
  # alone cannot launch on an A100. Override with -DCMAKE_CUDA_ARCHITECTURES
  # (e.g. 90 for a faster build, or "native" on a GPU machine with CMake
  # 3.24 or later).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # CMake knows nvcc's -std=c++20 (the CUDA20 dialect) only from 3.25.2
  # (Debian 12 has 3.25.1); without it any .cu target that asks for C++20
  # fails at generate time. This is what 3.25.2's NVIDIA-CUDA.cmake sets.
  if(CMAKE_VERSION VERSION_LESS 3.25.2 AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION -std=c++20)
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION -std=c++20)
  endif()
endif()

string(TOUPPER "${ZEST_MPI}" _zest_mpi_request)
set(_zest_mpi_found OFF)
if(NOT _zest_mpi_request STREQUAL "OFF")
  # The C API only: MPI_CXX_SKIP_MPICXX keeps the deprecated C++ bindings
  # (and libmpi_cxx) out.
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(_zest_mpi_found ON)
  endif()
endif()
_zest_resolve_switch(ZEST_MPI ${_zest_mpi_found})

# libtorch: the optional torch/ layer (zest::torch) and its tests. AUTO
# builds it when find_package(Torch) succeeds: Debian's libtorch-dev (CPU,
# 1.13), or any other libtorch named through Torch_DIR or CMAKE_PREFIX_PATH,
# e.g. the one inside PyTorch's wheel:
#   -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# The whole build must then use that libtorch's C++ ABI (a wheel's
# torch._C._GLIBCXX_USE_CXX11_ABI): ZEST's own std::string and containers
# cross into the layer, so a mismatch is a configure error here rather than
# a link error (or worse) later. scripts/gpu_check.sh passes it.
string(TOUPPER "${ZEST_TORCH}" _zest_torch_request)
set(_zest_torch_found OFF)
if(NOT _zest_torch_request STREQUAL "OFF")
  include(ZestTorchNvtx)
  find_package(Torch QUIET)
  if(Torch_FOUND OR TORCH_FOUND)
    set(_zest_torch_found ON)
  endif()
endif()
_zest_resolve_switch(ZEST_TORCH ${_zest_torch_found})
if(ZEST_TORCH)
  message(STATUS "ZEST: libtorch ${Torch_VERSION} from ${Torch_DIR}")
  if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
    set(_zest_torch_abi ${CMAKE_MATCH_1})
    set(_zest_build_abi 1)  # GCC's default since 5
    if(CMAKE_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
      set(_zest_build_abi ${CMAKE_MATCH_1})
    endif()
    if(NOT _zest_torch_abi STREQUAL _zest_build_abi)
      message(FATAL_ERROR "libtorch at ${Torch_DIR} is built with _GLIBCXX_USE_CXX11_ABI=${_zest_torch_abi} "
                          "but this build uses ${_zest_build_abi}: configure with "
                          "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=${_zest_torch_abi} "
                          "(and the same in CMAKE_CUDA_FLAGS), or -DZEST_TORCH=OFF")
    endif()
  endif()
endif()

# An optional library linked by its file, so that the exported static zest
# names it without a target of its own: its header and library where
# pkg-config (when present) says they are, or on the default paths. Sets
# ZEST_<NAME>_INCLUDE and ZEST_<NAME>_LIBRARY and resolves `switch`.
function(_zest_find_linked_by_file switch name pc_module header library)
  string(TOUPPER "${${switch}}" request)
  set(found OFF)
  if(NOT request STREQUAL "OFF")
    find_package(PkgConfig QUIET)
    if(PKG_CONFIG_FOUND)
      pkg_check_modules(ZEST_PC_${name} QUIET ${pc_module})
    endif()
    find_path(ZEST_${name}_INCLUDE ${header} HINTS ${ZEST_PC_${name}_INCLUDE_DIRS})
    find_library(ZEST_${name}_LIBRARY ${library} HINTS ${ZEST_PC_${name}_LIBRARY_DIRS})
    if(ZEST_${name}_INCLUDE AND ZEST_${name}_LIBRARY)
      set(found ON)
    endif()
  endif()
  _zest_resolve_switch(${switch} ${found})
  set(${switch} ${${switch}} PARENT_SCOPE)
endfunction()

# liburing for the NVMe tier; SentencePiece for tokenizer/.
_zest_find_linked_by_file(ZEST_IO_URING LIBURING liburing liburing.h uring)
set(ZEST_WITH_IO_URING ${ZEST_IO_URING})
_zest_find_linked_by_file(ZEST_SENTENCEPIECE SENTENCEPIECE sentencepiece sentencepiece_processor.h sentencepiece)
set(ZEST_WITH_SENTENCEPIECE ${ZEST_SENTENCEPIECE})

set(ZEST_WITH_CUDA ${ZEST_CUDA})
set(ZEST_WITH_NCCL ${ZEST_CUDA})
set(ZEST_WITH_MPI ${ZEST_MPI})
message(STATUS "ZEST: CUDA backend ${ZEST_CUDA}, MPI backend ${ZEST_MPI}, libtorch layer ${ZEST_TORCH}, io_uring ${ZEST_IO_URING}, SentencePiece ${ZEST_SENTENCEPIECE}, sanitizers '${ZEST_SANITIZE}'")

find_program(ZEST_CCACHE ccache)
if(ZEST_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${ZEST_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${ZEST_CCACHE})
endif()
