# enable_language(HIP) for AMD targets on Debian 12's ROCm 5.2 (TOOLCHAIN.md):
# - the compiler is LLVM's own clang++ (/usr/bin/clang++-15 picks clang-14's
#   runtime), found by cmake/hip_compiler.cmake;
# - CMake looks for hip-lang under a ROCm root: a folder in the build tree
#   whose lib/cmake/hip-lang links to Debian's;
# - the device libraries: Debian's, plus for gfx942 (MI300) an ISA-version
#   file ROCm 5.2 lacks, made here from the gfx940 one (its only content is the
#   ISA version constant, 9400 -> 9402) with the same LLVM's llvm-dis/llvm-as.
#   Nothing is downloaded.
set(_bitcode /usr/lib/x86_64-linux-gnu/amdgcn/bitcode)
set(_rocm_root ${CMAKE_BINARY_DIR}/rocm-root)
file(MAKE_DIRECTORY ${_rocm_root}/lib/cmake)
file(CREATE_LINK /usr/lib/x86_64-linux-gnu/cmake/hip-lang ${_rocm_root}/lib/cmake/hip-lang SYMBOLIC)
set(_devlib ${CMAKE_BINARY_DIR}/amdgcn-bitcode)
file(MAKE_DIRECTORY ${_devlib})
file(GLOB _bcs ${_bitcode}/*.bc)
foreach(_bc ${_bcs})
  get_filename_component(_name ${_bc} NAME)
  file(CREATE_LINK ${_bc} ${_devlib}/${_name} SYMBOLIC)
endforeach()

if(NOT DEFINED GDNKIT_HIP_ARCHITECTURES)
  set(_archs gfx908 gfx90a)
  get_filename_component(_llvm_bin ${GDNKIT_HIP_CLANG} DIRECTORY)
  if(GDNKIT_HIP_CLANG_VERSION GREATER_EQUAL 19 AND EXISTS ${_llvm_bin}/llvm-dis AND EXISTS ${_llvm_bin}/llvm-as)
    if(NOT EXISTS ${_devlib}/oclc_isa_version_942.bc)
      execute_process(
        COMMAND sh -c "'${_llvm_bin}/llvm-dis' '${_bitcode}/oclc_isa_version_940.bc' -o - | sed 's/i32 9400/i32 9402/' | '${_llvm_bin}/llvm-as' -o '${_devlib}/oclc_isa_version_942.bc'"
        RESULT_VARIABLE _rc)
      if(NOT _rc EQUAL 0)
        file(REMOVE ${_devlib}/oclc_isa_version_942.bc)
      endif()
    endif()
    if(EXISTS ${_devlib}/oclc_isa_version_942.bc)
      list(APPEND _archs gfx942)
    endif()
  endif()
  set(GDNKIT_HIP_ARCHITECTURES "${_archs}" CACHE STRING "AMD targets of the HIP backend")
endif()

set(CMAKE_HIP_COMPILER ${GDNKIT_HIP_CLANG} CACHE FILEPATH "HIP compiler")
set(CMAKE_HIP_COMPILER_ROCM_ROOT ${_rocm_root} CACHE PATH "ROCm root for CMake's HIP support")
set(ENV{CMAKE_PREFIX_PATH} "/usr/lib/x86_64-linux-gnu/cmake:$ENV{CMAKE_PREFIX_PATH}")
set(CMAKE_HIP_FLAGS "${CMAKE_HIP_FLAGS} --rocm-path=/usr --rocm-device-lib-path=${_devlib}")
set(CMAKE_HIP_ARCHITECTURES "${GDNKIT_HIP_ARCHITECTURES}")
# hip-lang puts -isystem /usr/include on every HIP compile; clang-19's HIP
# wrapper headers then lose <math.h> (#include_next from libstdc++'s <cmath>).
# Regular compiles drop implicit include directories, but CMake's compiler
# check runs before it knows them: skip the check, then tell CMake that
# /usr/include is implicit (it is, for the host C++ compiler too).
set(CMAKE_HIP_COMPILER_WORKS TRUE)
enable_language(HIP)
list(APPEND CMAKE_HIP_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
message(STATUS "gdnkit: HIP backend for ${GDNKIT_HIP_ARCHITECTURES} with ${GDNKIT_HIP_CLANG}")
