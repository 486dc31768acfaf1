# bench_det_gemm_cpu: the host det_gemm against Eigen's f32 GEMM (issue 5). Eigen lives in this one
# translation unit, compiled for AVX2+FMA like det_gemm's micro-kernel so both use the same
# instructions (the benchmark checks the CPU at start); Eigen's threads come from OpenMP.
find_package(OpenMP COMPONENTS CXX)
add_executable(bench_det_gemm_cpu ${CMAKE_CURRENT_LIST_DIR}/bench_det_gemm_cpu.cpp)
target_link_libraries(bench_det_gemm_cpu PRIVATE cubesim::kernels cubesim_bench_util Eigen3::Eigen)
target_compile_options(bench_det_gemm_cpu PRIVATE -mavx2 -mfma)
if(OpenMP_CXX_FOUND)
  target_link_libraries(bench_det_gemm_cpu PRIVATE OpenMP::OpenMP_CXX)
else()
  message(STATUS "bench_det_gemm_cpu: no OpenMP, Eigen will run on one thread only")
endif()
