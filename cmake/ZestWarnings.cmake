# Warnings for ZEST's own targets (never forced on consumers), and sanitizers.
function(zest_target_warnings target)
  set(flags -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
            -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough)
  if(ZEST_WERROR)
    list(APPEND flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${flags}>)
  # nvcc forwards host-compiler warnings; -Wpedantic is left out there because
  # nvcc's generated stubs trip it.
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror=cross-execution-space-call>)
  # __FILE__ relative to the source root so error messages name core/x.cpp,
  # also for headers reached through the build tree's include/zest link.
  set(maps -fmacro-prefix-map=${ZEST_INCLUDE_ROOT}/zest/= -fmacro-prefix-map=${PROJECT_SOURCE_DIR}/=)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${maps}>)
  foreach(m IN LISTS maps)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${m}>)
  endforeach()
endfunction()

if(ZEST_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${ZEST_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${ZEST_SANITIZE})
endif()
