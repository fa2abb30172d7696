# NCCL has no CMake package: make an imported target zest::nccl from its
# header and library. Looked for, in this order:
#   1. ZEST_NCCL_ROOT (a CMake or environment variable): <root>/include and
#      <root>/lib or lib64, e.g. a NCCL tarball or the pip wheel's folder;
#      or "wheel": the wheel of 4. below, and nothing else (the NCCL that
#      PyTorch's CUDA wheel loads, which a process using both must share);
#   2. beside the CUDA toolkit (CUDAToolkit_INCLUDE_DIRS, /usr/local/cuda);
#   3. the system's paths (Debian's and NVIDIA's libnccl-dev);
#   4. the pip wheel (nvidia-nccl-cu12/-cu13, which PyTorch's CUDA wheels
#      depend on) of Python3_EXECUTABLE, else of the python3 on the PATH: its
#      folder under site-packages/nvidia/ holds include/nccl.h and
#      lib/libnccl.so.2, with no unversioned libnccl.so beside it.
# Installed consumers get the same target from zestConfig.cmake, which
# includes this file.
if(NOT TARGET zest::nccl)
  # STRING, not PATH: CMake would turn "wheel" into a path.
  set(ZEST_NCCL_ROOT "$ENV{ZEST_NCCL_ROOT}" CACHE STRING "Where NCCL is (include/ and lib/), or wheel; empty: search")

  # The wheel's folder, asked of Python only when nothing else has NCCL.
  function(_zest_nccl_from_python out)
    set(${out} "" PARENT_SCOPE)
    set(python "${Python3_EXECUTABLE}")
    if(NOT python)
      find_program(ZEST_NCCL_PYTHON NAMES python3)
      set(python "${ZEST_NCCL_PYTHON}")
    endif()
    if(NOT python)
      return()
    endif()
    # nvidia is a namespace package: look through each of its folders, and
    # one level deeper (CUDA 13's wheels may nest a cu13/), for include/nccl.h.
    execute_process(
      COMMAND "${python}" -c [=[
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(0)
for base in nvidia.__path__:
    for pattern in ("*", "*/*"):
        for header in sorted(glob.glob(os.path.join(base, pattern, "include", "nccl.h"))):
            print(os.path.dirname(os.path.dirname(header)))
            sys.exit(0)
]=]
      OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND dir)
      set(${out} "${dir}" PARENT_SCOPE)
    endif()
  endfunction()

  set(_zest_nccl_names nccl libnccl.so.2)
  if(ZEST_NCCL_ROOT STREQUAL "wheel")
    _zest_nccl_from_python(_zest_nccl_wheel)
    if(NOT _zest_nccl_wheel)
      message(FATAL_ERROR "ZEST_NCCL_ROOT=wheel, but python3 (or Python3_EXECUTABLE) has no nvidia-nccl wheel "
                          "with include/nccl.h: install nvidia-nccl-cu12/-cu13, or point ZEST_NCCL_ROOT at NCCL")
    endif()
    set(ZEST_NCCL_ROOT_DIR ${_zest_nccl_wheel})
  else()
    set(ZEST_NCCL_ROOT_DIR ${ZEST_NCCL_ROOT})
  endif()
  if(ZEST_NCCL_ROOT_DIR)
    # Searched afresh each time, so that a changed root takes effect.
    unset(ZEST_NCCL_INCLUDE_DIR CACHE)
    unset(ZEST_NCCL_LIBRARY CACHE)
    find_path(ZEST_NCCL_INCLUDE_DIR nccl.h PATHS ${ZEST_NCCL_ROOT_DIR}/include NO_DEFAULT_PATH)
    find_library(ZEST_NCCL_LIBRARY NAMES ${_zest_nccl_names}
                 PATHS ${ZEST_NCCL_ROOT_DIR}/lib ${ZEST_NCCL_ROOT_DIR}/lib64 NO_DEFAULT_PATH)
    if(NOT ZEST_NCCL_INCLUDE_DIR OR NOT ZEST_NCCL_LIBRARY)
      message(FATAL_ERROR "ZEST_NCCL_ROOT=${ZEST_NCCL_ROOT} (${ZEST_NCCL_ROOT_DIR}) has no include/nccl.h with lib/libnccl.so "
                          "(or lib64/, or libnccl.so.2): point it at NCCL's folder, or leave it empty to search")
    endif()
  else()
    find_path(ZEST_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(ZEST_NCCL_LIBRARY NAMES ${_zest_nccl_names}
                 HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    if(NOT ZEST_NCCL_INCLUDE_DIR OR NOT ZEST_NCCL_LIBRARY)
      _zest_nccl_from_python(_zest_nccl_wheel)
      if(_zest_nccl_wheel)
        unset(ZEST_NCCL_INCLUDE_DIR CACHE)
        unset(ZEST_NCCL_LIBRARY CACHE)
        find_path(ZEST_NCCL_INCLUDE_DIR nccl.h PATHS ${_zest_nccl_wheel}/include NO_DEFAULT_PATH)
        find_library(ZEST_NCCL_LIBRARY NAMES ${_zest_nccl_names} PATHS ${_zest_nccl_wheel}/lib NO_DEFAULT_PATH)
      endif()
    endif()
    if(NOT ZEST_NCCL_INCLUDE_DIR OR NOT ZEST_NCCL_LIBRARY)
      message(FATAL_ERROR "NCCL not found (looked for nccl.h and libnccl beside the CUDA toolkit, in the "
                          "system's paths and in python3's nvidia-nccl wheel): install NCCL, set "
                          "ZEST_NCCL_ROOT to its folder, or configure with -DZEST_CUDA=OFF")
    endif()
  endif()
  # The version, from the header's NCCL_VERSION_CODE line (e.g. 22703).
  file(STRINGS ${ZEST_NCCL_INCLUDE_DIR}/nccl.h _zest_nccl_code REGEX "^#define NCCL_VERSION_CODE +[0-9]+")
  string(REGEX REPLACE "^#define NCCL_VERSION_CODE +" "" _zest_nccl_code "${_zest_nccl_code}")
  message(STATUS "ZEST: NCCL ${_zest_nccl_code} (version code): ${ZEST_NCCL_LIBRARY}")
  add_library(zest::nccl UNKNOWN IMPORTED)
  set_target_properties(zest::nccl PROPERTIES
    IMPORTED_LOCATION ${ZEST_NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${ZEST_NCCL_INCLUDE_DIR})
endif()
