# bench_attention_cuda: the tensor_core attention (kernels/attention_tc.h) forward and backward on the GPU;
# benches/torch_attention.py runs it alternately with PyTorch's scaled_dot_product_attention on the
# same shapes. Included by benches/CMakeLists.txt; built only with CUDA (cudart static).
if(CUBESIM_HAVE_CUDA AND TARGET cubesim::kernels_cuda)
  add_executable(bench_attention_cuda ${CMAKE_CURRENT_LIST_DIR}/bench_attention_cuda.cpp)
  target_include_directories(bench_attention_cuda PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(bench_attention_cuda PRIVATE cubesim::kernels_cuda cubesim::kernels cubesim_bench_util
    CUDA::cudart_static)
endif()
