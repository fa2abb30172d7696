# cmake/ZestFindNccl.cmake against a stand-in of the nvidia-nccl pip wheel
# (nvidia/nccl/{include/nccl.h,lib/libnccl.so.2}, no unversioned libnccl.so)
# on PYTHONPATH, with the CUDA toolkit's and the system's folders hidden:
# found on its own, found as ZEST_NCCL_ROOT=wheel, and clear errors for a
# ZEST_NCCL_ROOT without NCCL and for "wheel" without a wheel.
# Inputs: ZEST_CMAKE_DIR, PROJECT_DIR (nccl_project/), WORK_DIR, GENERATOR.
file(REMOVE_RECURSE ${WORK_DIR})
set(wheel ${WORK_DIR}/site/nvidia/nccl)
file(MAKE_DIRECTORY ${wheel}/include ${wheel}/lib ${WORK_DIR}/empty)
file(WRITE ${wheel}/include/nccl.h "#define NCCL_VERSION_CODE 22703\n")
file(WRITE ${wheel}/lib/libnccl.so.2 "")
# python3 without its site-packages (-S), so that a real wheel there (the
# GPU machine has one) cannot stand in for the missing one below.
find_program(python3 NAMES python3 REQUIRED)
file(WRITE ${WORK_DIR}/python3 "#!/bin/sh\nexec ${python3} -S \"$@\"\n")
file(CHMOD ${WORK_DIR}/python3 PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
# The toolkit's and the system's folders, hidden through an initial cache
# (a list on the command line would be split at its semicolons).
file(WRITE ${WORK_DIR}/hide.cmake [=[
set(CMAKE_IGNORE_PATH
  /usr/local/cuda/include /usr/local/cuda/lib64 /usr/local/cuda/lib
  /usr/local/cuda/targets/x86_64-linux/include /usr/local/cuda/targets/x86_64-linux/lib
  /usr/include /usr/lib /usr/lib/x86_64-linux-gnu /usr/local/include /usr/local/lib
  CACHE STRING "")
]=])

include(${CMAKE_CURRENT_LIST_DIR}/configure_check.cmake)
# configure(NAME EXPECT_RC PYTHONPATH ARGS...)
function(configure name expect_rc pythonpath)
  set(ENV{PYTHONPATH} ${pythonpath})
  configure_project(${name} ${expect_rc} ${PROJECT_DIR} -DZEST_CMAKE_DIR=${ZEST_CMAKE_DIR}
                    -DPython3_EXECUTABLE=${WORK_DIR}/python3 -C ${WORK_DIR}/hide.cmake ${ARGN})
  set(output "${output}" PARENT_SCOPE)
endfunction()

set(found "ZEST: NCCL 22703 \\(version code\\): ${wheel}/lib/libnccl.so.2")
configure(search 0 ${WORK_DIR}/site)
expect(search "${found}")
expect(search_target "zest::nccl: ${wheel}/lib/libnccl.so.2 with ${wheel}/include")
configure(root_wheel 0 ${WORK_DIR}/site -DZEST_NCCL_ROOT=wheel)
expect(root_wheel "${found}")
configure(root_dir 0 ${WORK_DIR}/empty -DZEST_NCCL_ROOT=${wheel})
expect(root_dir "${found}")
configure(root_empty 1 ${WORK_DIR}/empty -DZEST_NCCL_ROOT=${WORK_DIR}/empty)
expect(root_empty "ZEST_NCCL_ROOT=${WORK_DIR}/empty .*has no include/nccl.h")
configure(no_wheel 1 ${WORK_DIR}/empty -DZEST_NCCL_ROOT=wheel)
expect(no_wheel "ZEST_NCCL_ROOT=wheel, but python3 .*has no nvidia-nccl wheel")
