#!/usr/bin/env bash
# Builds the cuda backend's test and cubesim-xcheck here (build-cu/) and copies them into gpu-out/
# (git-ignored), the folder the `run` tool carries to the GPU machine; scripts/gpu/cuda_backend.sh
# runs them there. Static cudart and Boost.Context; NCCL is loaded at run time there (dlopen).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build-cu/CMakeCache.txt ] || cmake -S . -B build-cu -DCMAKE_BUILD_TYPE=Release -DCUBESIM_BUILD_PYTHON=OFF -DCUBESIM_CUDA=ON
cmake --build build-cu --target test_runtime_cuda cubesim_xcheck -j2
grep -qx '/gpu-out/' .git/info/exclude 2>/dev/null || echo '/gpu-out/' >> .git/info/exclude
mkdir -p gpu-out
cp build-cu/tests/runtime/test_runtime_cuda build-cu/bin/cubesim-xcheck gpu-out/
strip gpu-out/test_runtime_cuda gpu-out/cubesim-xcheck || true
ls -la gpu-out
