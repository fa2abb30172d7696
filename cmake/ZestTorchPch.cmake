# torch/torch.h is about 400,000 lines once preprocessed, and some 35 units
# above the libtorch layer include it. With ZEST_TORCH_PCH it is parsed
# once, into a precompiled header (torch/CMakeLists.txt makes it, in about
# 70 s) that each target calling zest_use_torch_pch shares: examples/common's
# six units took 24-54 s each instead of 32-72 s on 2 idle cores. What is
# left is mostly torch's templates, which GCC instantiates again at the end
# of every unit that includes them, precompiled or not.
#
# A unit the header does not suit (other flags) gets a warning
# (-Winvalid-pch) and parses torch.h itself: slower, never wrong. A target's
# units that do not include torch opt out with the source property
# SKIP_PRECOMPILE_HEADERS.
#
# ccache caches such units only with sloppiness pch_defines,time_macros
# (its manual, "Precompiled headers"); without it, it compiles them every
# time. Those targets' launcher sets it for them alone.
option(ZEST_TORCH_PCH "Precompile torch/torch.h once for the targets that include it" ON)

function(zest_torch_pch_launcher target)
  if(ZEST_CCACHE)
    set_target_properties(${target} PROPERTIES
      CXX_COMPILER_LAUNCHER "env;CCACHE_SLOPPINESS=pch_defines,time_macros;${ZEST_CCACHE}")
  endif()
endfunction()

function(zest_use_torch_pch target)
  if(TARGET zest_torch_pch)
    target_precompile_headers(${target} REUSE_FROM zest_torch_pch)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch -Wno-error=invalid-pch>)
    zest_torch_pch_launcher(${target})
  endif()
endfunction()
