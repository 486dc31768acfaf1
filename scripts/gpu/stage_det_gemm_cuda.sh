#!/usr/bin/env bash
# Builds the det_gemm CUDA test and benchmark here (build-cuda/) and copies the two executables into
# gpu-out/ (git-ignored through .git/info/exclude), the folder the `run` tool carries to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build-cuda/CMakeCache.txt ] || cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCUBESIM_BUILD_PYTHON=OFF -DCUBESIM_CUDA=ON
cmake --build build-cuda --target test_det_gemm_cuda bench_det_gemm_cuda -j2
grep -qx '/gpu-out/' .git/info/exclude 2>/dev/null || echo '/gpu-out/' >> .git/info/exclude
mkdir -p gpu-out
cp build-cuda/tests/kernels/cuda/test_det_gemm_cuda build-cuda/benches/bench_det_gemm_cuda gpu-out/
strip gpu-out/* || true
ls -la gpu-out
