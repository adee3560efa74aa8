# Script mode (cmake -P): install, configure the consumer, build, run.
file(REMOVE_RECURSE "${SCRATCH}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: '${ARGN}' failed (${rc})")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install "${GDNKIT_BUILD_DIR}" --prefix "${SCRATCH}/prefix")
run(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${SCRATCH}/build" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${SCRATCH}/prefix")
run(${CMAKE_COMMAND} --build "${SCRATCH}/build")
run("${SCRATCH}/build/consumer")
run("${SCRATCH}/build/consumer_c")
