# bench_det_gemm_cuda: det_gemm on the GPU (exact and tensor_core modes) against cuBLAS in the same run.
# Included by benches/CMakeLists.txt; built only with CUDA. cudart is static so the binary runs on the
# GPU machine; cuBLAS ships only as a shared library here, found there through LD_LIBRARY_PATH.
if(CUBESIM_HAVE_CUDA AND TARGET cubesim::kernels_cuda)
  add_executable(bench_det_gemm_cuda
    ${CMAKE_CURRENT_LIST_DIR}/bench_det_gemm_cuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/bench_det_gemm_cuda.cu)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/bench_det_gemm_cuda.cu PROPERTIES
    COMPILE_OPTIONS "-std=c++17")
  set_target_properties(bench_det_gemm_cuda PROPERTIES CUDA_STANDARD 17)
  target_include_directories(bench_det_gemm_cuda PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(bench_det_gemm_cuda PRIVATE cubesim::kernels_cuda cubesim::kernels cubesim_bench_util
    CUDA::cublas CUDA::cudart_static)
endif()
