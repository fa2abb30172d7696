# Helpers of the -P scripts in tests/cmake that configure a small project
# and check what CMake printed. Needs WORK_DIR and GENERATOR.

# configure_project(NAME EXPECT_RC PROJECT_DIR ARGS...): configures
# PROJECT_DIR in WORK_DIR/NAME with ARGS; fails unless it exits 0 exactly
# when EXPECT_RC is 0. What CMake printed is left in `output`.
function(configure_project name expect_rc project_dir)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S ${project_dir} -B ${WORK_DIR}/${name} -G ${GENERATOR} ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(output "${out}${err}" PARENT_SCOPE)
  if(expect_rc EQUAL 0 AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: configure failed (${rc}):\n${out}\n${err}")
  elseif(NOT expect_rc EQUAL 0 AND rc EQUAL 0)
    message(FATAL_ERROR "${name}: configure succeeded but should have failed:\n${out}")
  endif()
endfunction()

# expect(NAME REGEX): `output` matches REGEX. CMake wraps its messages, so
# runs of spaces and line breaks count as one space.
function(expect name regex)
  string(REGEX REPLACE "[ \n]+" " " flat "${output}")
  if(NOT flat MATCHES "${regex}")
    message(FATAL_ERROR "${name}: the output does not match '${regex}':\n${output}")
  endif()
  message(STATUS "${name}: ok")
endfunction()
