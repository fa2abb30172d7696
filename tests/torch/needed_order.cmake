# cmake -DREADELF=... -DBINARY=... -P needed_order.cmake: fails unless
# BINARY names libstdc++ among its NEEDED libraries before any of libtorch's
# (libtorch*, libc10*), so that the dynamic linker binds libstdc++'s symbols
# to libstdc++ rather than to the copies torch's wheels export.
execute_process(COMMAND "${READELF}" -d "${BINARY}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${BINARY} failed (${rc})")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]\n]*\\]" needed "${dynamic}")
set(index 0)
set(stdcxx -1)
set(torch -1)
foreach(line IN LISTS needed)
  string(REGEX REPLACE ".*\\[(.*)\\]" "\\1" lib "${line}")
  if(lib MATCHES "^libstdc\\+\\+\\.so" AND stdcxx EQUAL -1)
    set(stdcxx ${index})
  elseif(lib MATCHES "^lib(torch|c10)" AND torch EQUAL -1)
    set(torch ${index})
  endif()
  math(EXPR index "${index} + 1")
endforeach()
if(stdcxx EQUAL -1 OR torch EQUAL -1)
  message(FATAL_ERROR "${BINARY}: libstdc++ at ${stdcxx}, libtorch at ${torch} among its NEEDED libraries: expected both")
endif()
if(stdcxx GREATER torch)
  message(FATAL_ERROR "${BINARY} names libtorch (NEEDED #${torch}) before libstdc++ (#${stdcxx}): "
                      "std::filesystem and other libstdc++ symbols would bind to the copies torch's wheels export")
endif()
message(STATUS "libstdc++ is NEEDED #${stdcxx}, libtorch #${torch}")
