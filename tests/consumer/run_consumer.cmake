# Script mode (cmake -P): install, configure the consumer, build, run.
file(REMOVE_RECURSE "${SCRATCH}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: '${ARGN}' failed (${rc})")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install "${GDNKIT_BUILD_DIR}" --prefix "${SCRATCH}/prefix")
# The golden-file header belongs to a build-tree library: it must not be installed.
file(GLOB_RECURSE _golden_hpp "${SCRATCH}/prefix/*/golden.hpp")
if(_golden_hpp)
  message(FATAL_ERROR "consumer test: golden.hpp was installed (${_golden_hpp}) without its library")
endif()
run(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${SCRATCH}/build" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${SCRATCH}/prefix")
run(${CMAKE_COMMAND} --build "${SCRATCH}/build")
run("${SCRATCH}/build/consumer")
run("${SCRATCH}/build/consumer_c")
