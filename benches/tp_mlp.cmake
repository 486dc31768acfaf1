if(TARGET cubesim::sim_hw)
  add_executable(bench_tp_mlp ${CMAKE_CURRENT_LIST_DIR}/bench_tp_mlp.cpp)
  target_link_libraries(bench_tp_mlp PRIVATE cubesim::tp cubesim_bench_util)
endif()
