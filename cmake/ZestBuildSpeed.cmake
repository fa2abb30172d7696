# What a build of ZEST costs, and the settings that keep it small (measured
# on the 2-core machine: docs/BUILD.md, "Where the build's time goes").
#
# ZEST_DEBUG_INFO (RelWithDebInfo, GCC and Clang): "lines" (the default)
#   gives line tables, so backtraces, sanitizer reports and a debugger's
#   stepping name files and lines; "full" gives -g's types and locals as
#   well. Full debug information of libtorch's templates took a quarter of
#   a unit's compile (torch/lora.cpp: 35.9 s with -g, 27.4 s with -g1) and
#   made its object 3.4 times larger for every link to read.
# ZEST_LINKER: lld where the compiler can use it (Debian's lld; AUTO), the
#   system's default linker otherwise (or with OFF).
# ZEST_UNITY_BUILD: the library, the tests and the examples compiled as a
#   few units a target (CMake's unity build), each source with its own
#   #line, so messages name the file: the headers every unit includes (the
#   standard library, fmt, doctest, libtorch's templates) are read and
#   instantiated once a batch instead of once a file. A test file whose
#   internal names collide with another's in its batch puts its body in a
#   namespace named after the file.
set(ZEST_DEBUG_INFO lines CACHE STRING "Debug information of RelWithDebInfo builds: lines or full")
set_property(CACHE ZEST_DEBUG_INFO PROPERTY STRINGS lines full)
if(ZEST_DEBUG_INFO STREQUAL "lines")
  add_compile_options($<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:RelWithDebInfo>>:-g1>)
elseif(NOT ZEST_DEBUG_INFO STREQUAL "full")
  message(FATAL_ERROR "ZEST_DEBUG_INFO is '${ZEST_DEBUG_INFO}': expected lines or full")
endif()

set(ZEST_LINKER AUTO CACHE STRING "Link with lld: AUTO (where it works), ON or OFF")
set_property(CACHE ZEST_LINKER PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${ZEST_LINKER}" _zest_linker)
if(NOT _zest_linker STREQUAL "OFF")
  include(CheckLinkerFlag)
  check_linker_flag(CXX "-fuse-ld=lld" ZEST_HAVE_LLD)
  if(ZEST_HAVE_LLD)
    add_link_options($<$<LINK_LANGUAGE:CXX>:-fuse-ld=lld>)
  elseif(_zest_linker STREQUAL "ON")
    message(FATAL_ERROR "ZEST_LINKER=ON but the compiler cannot link with lld: install lld (scripts/setup.sh) "
                        "or configure with -DZEST_LINKER=OFF")
  endif()
endif()

# zest_alone(sources...): library sources that only some configurations
# build (MPI, CUDA, io_uring, and their stubs) compile alone, so that the
# unity batches of the rest are the same in every configuration: names
# that never met in the batches of the default build (which every change
# compiles) then never meet in a sanitizer's or the GPU kit's.
function(zest_alone)
  set_source_files_properties(${ARGN} DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endfunction()

# zest_test_target(target): a test executable's own code at -O1 in
# RelWithDebInfo builds (the library it tests stays at -O2): 30% less to
# compile (test_engine's third batch: 20.8 s at -O2, 14.6 s at -O1). The
# level changes no rounding (nothing here builds with -ffast-math), and the
# test files whose references must round as the library does set
# -ffp-contract=off themselves (tests/CMakeLists.txt).
function(zest_test_target target)
  target_compile_options(${target} PRIVATE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:RelWithDebInfo>>:-O1>)
endfunction()

option(ZEST_UNITY_BUILD "Compile each target's sources in a few batches (CMake's unity build)" ON)
set(ZEST_UNITY_BATCH 8 CACHE STRING "Sources per unity batch")

# zest_unity(target [batch]): a unity build of the target's C++ sources,
# `batch` files a unit (ZEST_UNITY_BATCH by default).
function(zest_unity target)
  if(NOT ZEST_UNITY_BUILD)
    return()
  endif()
  set(batch ${ZEST_UNITY_BATCH})
  if(ARGC GREATER 1)
    set(batch ${ARGV1})
  endif()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch}
                                             UNITY_BUILD_UNIQUE_ID ZEST_UNITY_ID)
endfunction()
