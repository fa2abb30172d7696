# Third-party packages, all from the distribution (scripts/setup.sh installs
# them), or from the folder scripts/gpu_deps.sh gathers for an offline machine
# (through CMAKE_PREFIX_PATH).
include(GNUInstallDirs)
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
# fmt as a compiled library (fmt::fmt), or header-only
# (-DZEST_FMT_HEADER_ONLY=ON: fmt::fmt-header-only, FMT_HEADER_ONLY), so that
# no libfmt has to be installed where the programs run; the offline GPU kit
# builds this way. Every target names ${ZEST_FMT_TARGET}, never fmt::fmt
# directly: a program that mixed the two would need the library anyway.
option(ZEST_FMT_HEADER_ONLY "Use fmt header-only (no libfmt at run time)" OFF)
if(ZEST_FMT_HEADER_ONLY)
  set(ZEST_FMT_TARGET fmt::fmt-header-only)
else()
  set(ZEST_FMT_TARGET fmt::fmt)
endif()
find_package(nlohmann_json 3 REQUIRED)

if(ZEST_CUDA)
  find_package(CUDAToolkit REQUIRED)
  include(ZestFindNccl)
endif()
if(ZEST_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI REQUIRED COMPONENTS CXX)
endif()
if(ZEST_BUILD_TESTS)
  find_package(doctest REQUIRED)
endif()
if(ZEST_BUILD_EXTRAS)
  # Header-only; the tools', examples' and benchmarks' command lines.
  find_package(CLI11 CONFIG REQUIRED)
endif()
