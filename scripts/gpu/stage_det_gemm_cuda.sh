#!/usr/bin/env bash
# Builds the det_gemm CUDA test and benchmark here (build-cuda/) and copies the two executables into
# gpu-out/ (git-ignored through .git/info/exclude), the folder the `run` tool carries to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build-cuda/CMakeCache.txt ] || cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCUBESIM_BUILD_PYTHON=OFF -DCUBESIM_CUDA=ON
# Others' work in progress can break the configure step of the shared tree; then rebuild these
# targets from the last generated makefiles (CMake's target/fast rules skip the re-configure).
if ! cmake --build build-cuda --target test_det_gemm_cuda bench_det_gemm_cuda -j2; then
  echo "stage: configure failed; building from the existing makefiles"
  make -C build-cuda cubesim_kernels/fast cubesim_kernels_cuda/fast test_det_gemm_cuda/fast bench_det_gemm_cuda/fast -j2
fi
exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
grep -qx '/gpu-out/' "$exclude" 2>/dev/null || echo '/gpu-out/' >> "$exclude"
mkdir -p gpu-out
cp build-cuda/tests/kernels/cuda/test_det_gemm_cuda build-cuda/benches/bench_det_gemm_cuda gpu-out/
strip gpu-out/* || true
ls -la gpu-out
