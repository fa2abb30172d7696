# memory_compare, quickly: stages 0-3 on 1 and 3 in-process ranks, 2 steps,
# bf16. It must exit 0 (measured model states equal the estimate and all
# ranks agree), and its files must hold what a reader needs: an SVG whose
# root is <svg>...</svg> with one segment per bar and category (4 stages x 2
# worlds x 4 model-state categories, all non-zero in bf16 with AdamW) and
# one estimate marker per bar, and a Markdown report with a row per run in
# each of its two tables. A bad argument exits 2.
# Inputs: PROGRAM, WORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(md ${WORK_DIR}/memory_compare.md)
set(svg ${WORK_DIR}/memory_compare.svg)

execute_process(COMMAND ${PROGRAM} --steps 2 --worlds 1,3 --markdown ${md} --svg ${svg}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "memory_compare exited with ${rc}:\n${err}")
endif()
if(NOT out MATCHES "Measured equals estimated for every model-state category of all 8 runs")
  message(FATAL_ERROR "memory_compare did not report measured = estimated")
endif()

function(expect_count text pattern expected what)
  string(REGEX MATCHALL "${pattern}" found "${text}")
  list(LENGTH found n)
  if(NOT n EQUAL expected)
    message(FATAL_ERROR "${what}: found ${n}, expected ${expected}")
  endif()
endfunction()

file(READ ${svg} chart)
string(STRIP "${chart}" chart)
if(NOT chart MATCHES "^<svg xmlns=\"http://www.w3.org/2000/svg\"" OR NOT chart MATCHES "</svg>$")
  message(FATAL_ERROR "${svg} is not one <svg> element")
endif()
expect_count("${chart}" "<svg" 1 "<svg> elements")
expect_count("${chart}" "<rect class=\"segment\"" 32 "bar segments")
expect_count("${chart}" "<line class=\"marker\"" 8 "estimate markers")
expect_count("${chart}" "<rect class=\"swatch\"" 4 "legend entries")
string(REGEX MATCHALL "<title>" opened "${chart}")
string(REGEX MATCHALL "</title>" closed "${chart}")
list(LENGTH opened n_open)
list(LENGTH closed n_closed)
if(NOT n_open EQUAL n_closed OR NOT n_open EQUAL 40)
  message(FATAL_ERROR "tooltips: ${n_open} <title> and ${n_closed} </title>, expected 40 of each")
endif()

file(READ ${md} report)
expect_count("${report}" "\n\\| stage \\| ranks \\|" 2 "Markdown tables")
expect_count("${report}" "\n\\| [0-3] \\| [13] \\|" 16 "Markdown rows (8 runs in each of 2 tables)")
if(NOT report MATCHES "!\\[memory per rank by category\\]\\(memory_compare.svg\\)")
  message(FATAL_ERROR "${md} does not link the chart")
endif()

execute_process(COMMAND ${PROGRAM} --dtype fp8 RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--dtype 'fp8': expected fp32, bf16 or fp16")
  message(FATAL_ERROR "a bad argument: exit ${rc}, '${err}'")
endif()
message(STATUS "memory_compare_check: passed")
