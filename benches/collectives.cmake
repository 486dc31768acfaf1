if(TARGET cubesim::sim_hw)
  add_executable(bench_collectives ${CMAKE_CURRENT_LIST_DIR}/bench_collectives.cpp)
  target_link_libraries(bench_collectives PRIVATE cubesim::runtime cubesim_bench_util)
endif()
