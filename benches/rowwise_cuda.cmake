# bench_rowwise_cuda: the row-wise ops and the transformer layer step on the cuda backend, GPU kernels
# against the host path. Included by benches/CMakeLists.txt; built only with the cuda backend.
if(TARGET cubesim::runtime_cuda AND TARGET cubesim::tp)
  add_executable(bench_rowwise_cuda ${CMAKE_CURRENT_LIST_DIR}/bench_rowwise_cuda.cpp)
  target_link_libraries(bench_rowwise_cuda PRIVATE cubesim::runtime_cuda cubesim::tp cubesim_bench_util)
endif()
