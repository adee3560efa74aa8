# Is a HIP compiler present? (The HIP backend's own CMake does the
# enable_language(HIP) set-up that Debian's ROCm layout needs.)
set(GDNKIT_HIP_COMPILER_FOUND OFF)
if(EXISTS /usr/lib/llvm-15/bin/clang++ AND EXISTS /usr/lib/x86_64-linux-gnu/cmake/hip-lang)
  set(GDNKIT_HIP_COMPILER_FOUND ON)
endif()
