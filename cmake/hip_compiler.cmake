# Is a HIP compiler for AMD present? Debian's ROCm 5.2 with clang: clang-19
# when installed (it knows gfx942, MI300), else clang-15 (gfx908, gfx90a).
# cmake/hip_language.cmake does the enable_language(HIP) set-up that Debian's
# layout needs.
set(GDNKIT_HIP_COMPILER_FOUND OFF)
set(GDNKIT_HIP_LLVM_VERSIONS 19 15 CACHE STRING "LLVM versions tried for the HIP compiler, in order")
set(GDNKIT_HIP_CLANG "")
if(EXISTS /usr/lib/x86_64-linux-gnu/cmake/hip-lang)
  foreach(_v ${GDNKIT_HIP_LLVM_VERSIONS})
    if(NOT GDNKIT_HIP_CLANG AND EXISTS /usr/lib/llvm-${_v}/bin/clang++)
      set(GDNKIT_HIP_CLANG /usr/lib/llvm-${_v}/bin/clang++)
      set(GDNKIT_HIP_CLANG_VERSION ${_v})
      set(GDNKIT_HIP_COMPILER_FOUND ON)
    endif()
  endforeach()
endif()
