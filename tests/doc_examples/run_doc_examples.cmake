# ctest's doc_examples: builds the target doc_examples (the documentation's
# code examples) and runs it. A block that does not compile fails here, with
# the compiler's messages, which name the Markdown file or the header and the
# block's line (the generated code carries #line directives).
# Then each program among them is compiled alone (syntax only: its own
# #includes must be enough), and the examples marked `run` are run.
# Inputs: BUILD_DIR, EXE, WORK_DIR, PYTHON, SCRIPT, GEN_DIR.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target doc_examples
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  set(all "${out}\n${err}")
  string(REGEX MATCHALL "([^\n ]+\\.(md|h|cuh):[0-9]+:[0-9]+: error|doc_examples: [^\n ]+:[0-9]+:)[^\n]*" errors "${all}")
  list(REMOVE_DUPLICATES errors)
  list(JOIN errors "\n  " listed)
  message(FATAL_ERROR "${all}\n\ndoc_examples: code examples that do not compile, or comment lines like code in no example:\n  ${listed}\n"
                      "(the file and line are the example's; see docs/BUILD.md, Code examples in the docs)")
endif()
execute_process(COMMAND ${PYTHON} ${SCRIPT} --alone ${BUILD_DIR} ${GEN_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "doc_examples: a program in the docs does not compile on its own (above)")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${EXE} WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "doc_examples: an example marked `run` failed (above)")
endif()
