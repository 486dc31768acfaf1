# bench_transfer: point-to-point latency and bandwidth on every shipped topology (issue 3).
add_executable(bench_transfer ${CMAKE_CURRENT_LIST_DIR}/bench_transfer.cpp)
target_link_libraries(bench_transfer PRIVATE cubesim::sim_hw cubesim_bench_util)
