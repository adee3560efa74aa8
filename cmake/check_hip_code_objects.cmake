# ctest script: every kernel object of the HIP backend carries a code object for
# every AMD target asked for. Run as
#   cmake -DOBJECTS=<objects> -DTARGETS=<gfx...> -DLLVM_BIN=<dir> -DWORK=<dir> -P check_hip_code_objects.cmake
# (llvm-objcopy takes out the .hip_fatbin section, clang-offload-bundler lists it).
file(MAKE_DIRECTORY ${WORK})
set(_failed 0)
foreach(obj ${OBJECTS})
  get_filename_component(_name ${obj} NAME)
  # The kernels live in the decode_* objects (the backend glue has none).
  if(NOT _name MATCHES "^decode_")
    continue()
  endif()
  set(_fatbin ${WORK}/${_name}.fatbin)
  execute_process(COMMAND ${LLVM_BIN}/llvm-objcopy --dump-section=.hip_fatbin=${_fatbin} ${obj} ${WORK}/${_name}.stripped
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "${_name}: no .hip_fatbin section (${err})")
    set(_failed 1)
    continue()
  endif()
  execute_process(COMMAND ${LLVM_BIN}/clang-offload-bundler --list --type=o --input=${_fatbin}
                  OUTPUT_VARIABLE bundles RESULT_VARIABLE rc)
  foreach(t ${TARGETS})
    if(NOT bundles MATCHES "amdgcn-amd-amdhsa--${t}(\n|$)")
      message(SEND_ERROR "${_name}: no code object for ${t} (bundles: ${bundles})")
      set(_failed 1)
    endif()
  endforeach()
  string(REGEX MATCHALL "gfx[0-9a-z]+" _found "${bundles}")
  message(STATUS "${_name}: ${_found}")
endforeach()
if(_failed)
  message(FATAL_ERROR "HIP code objects incomplete")
endif()
