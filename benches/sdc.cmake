if(TARGET cubesim::sdc)
  add_executable(bench_sdc ${CMAKE_CURRENT_LIST_DIR}/bench_sdc.cpp)
  target_link_libraries(bench_sdc PRIVATE cubesim::sdc cubesim::backends cubesim_bench_util)
endif()
