# bench_det_gemm_cpu: the host det_gemm against two peers, Eigen's f32 GEMM (issue 5) and OpenBLAS's
# sgemm (issue 14). Eigen lives in this one translation unit, compiled for AVX2+FMA like det_gemm's
# micro-kernel so both use the same instructions (the benchmark checks the CPU at start); Eigen's
# threads come from OpenMP. OpenBLAS is Debian's libopenblas-dev, found through its pkg-config module
# `openblas`, which names OpenBLAS itself (openblas-pthread/), never the reference BLAS that Debian's
# alternatives may put behind libblas.so; it picks its own kernel for the CPU at run time.
find_package(OpenMP COMPONENTS CXX)
find_package(PkgConfig)
if(PkgConfig_FOUND)
  pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
endif()
if(NOT OPENBLAS_FOUND)
  message(FATAL_ERROR "bench_det_gemm_cpu needs OpenBLAS (pkg-config module 'openblas'): install Debian's "
                      "libopenblas-dev (scripts/install-deps.sh does), or configure with -DCUBESIM_BUILD_BENCHES=OFF")
endif()
add_executable(bench_det_gemm_cpu ${CMAKE_CURRENT_LIST_DIR}/bench_det_gemm_cpu.cpp)
target_link_libraries(bench_det_gemm_cpu PRIVATE cubesim::kernels cubesim_bench_util Eigen3::Eigen
                      PkgConfig::OPENBLAS)
target_compile_options(bench_det_gemm_cpu PRIVATE -mavx2 -mfma)
if(OpenMP_CXX_FOUND)
  target_link_libraries(bench_det_gemm_cpu PRIVATE OpenMP::OpenMP_CXX)
else()
  message(STATUS "bench_det_gemm_cpu: no OpenMP, Eigen will run on one thread only")
endif()
