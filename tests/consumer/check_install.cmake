# Installs the built ZEST into a scratch prefix, then configures, builds and
# runs tests/consumer against that prefix alone.
# Inputs: ZEST_BINARY_DIR, CONSUMER_SOURCE_DIR, WORK_DIR, GENERATOR; optional
# CONSUMER (the executable, zest_consumer) and EXPECT (a regex its output
# must match); and what ZEST's own configure was given, for a consumer on the
# same machine: BUILD_PREFIX_PATH (its CMAKE_PREFIX_PATH, '|'-separated: where
# fmt or libtorch came from, e.g. gpu-kit/), BUILD_CXX_FLAGS (the C++ ABI
# libtorch needs) and BUILD_NCCL_ROOT.
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run_step("install" ${CMAKE_COMMAND} --install ${ZEST_BINARY_DIR} --prefix ${prefix})
# The prefixes through the environment (':'-separated), since a ';' would
# split the argument.
string(REPLACE "|" ":" build_prefixes "${BUILD_PREFIX_PATH}")
set(ENV{CMAKE_PREFIX_PATH} "${build_prefixes}")
run_step("configure consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
         -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
         "-DCMAKE_CXX_FLAGS=${BUILD_CXX_FLAGS}" "-DZEST_NCCL_ROOT=${BUILD_NCCL_ROOT}")
run_step("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
if(NOT CONSUMER)
  set(CONSUMER zest_consumer)
endif()
if(NOT EXPECT)
  set(EXPECT "zest consumer ok: 1.5, 2000 parameter bytes")
endif()
run_step("run consumer" ${WORK_DIR}/build/${CONSUMER})
message(STATUS "${step_output}")
if(NOT step_output MATCHES "${EXPECT}")
  message(FATAL_ERROR "unexpected consumer output: ${step_output}")
endif()
