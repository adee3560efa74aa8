# ctest: install gdnkit into a scratch prefix, build tests/consumer against it
# with find_package(gdnkit), and run it.
add_test(NAME consumer_find_package
  COMMAND ${CMAKE_COMMAND}
    -DGDNKIT_BUILD_DIR=${PROJECT_BINARY_DIR}
    -DCONSUMER_SOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}
    -DSCRATCH=${CMAKE_CURRENT_BINARY_DIR}/consumer
    -DGENERATOR=${CMAKE_GENERATOR}
    -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
set_tests_properties(consumer_find_package PROPERTIES TIMEOUT 300)
