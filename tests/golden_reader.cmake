# Golden-file library tests: test_golden_reader.cpp (safetensors reader/writer,
# load_case, list_cases) and test_golden_run.cpp (compare, run_case on the host
# backend), one executable. Included from tests/CMakeLists.txt, which provides
# find_package(GTest) and include(GoogleTest).
add_executable(test_golden_reader test_golden_reader.cpp test_golden_run.cpp)
target_link_libraries(test_golden_reader PRIVATE gdnkit_golden GTest::gtest_main gdnkit_warnings)
gtest_discover_tests(test_golden_reader)
