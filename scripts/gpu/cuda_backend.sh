#!/usr/bin/env bash
# Runs the cuda backend's tests and cubesim-xcheck on the GPU machine (the `run` tool of this
# workplace, nvidia-h200-x4 for 1, 2 and 4 GPUs) from binaries built here by
# scripts/gpu/stage_cuda_backend.sh and carried in gpu-out/. Logs and JSON go to $OUT (or ./out).
#   scripts/gpu/cuda_backend.sh [smoke] [xcheck] [test]      (default: all three, in that order)
# Environment: XCHECK_ARGS (extra cubesim-xcheck flags), GTEST_FILTER (for `test`).
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
BIN=${BIN:-gpu-out}
# NVLink multicast stays off (shared hosts; see the device notes). The backend also forces it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUBESIM_TOPOLOGY_DIR="$PWD/topologies"
if ! ldconfig -p | grep -q 'libnccl.so.2 '; then
  lib=$(find /usr/local /usr/lib /opt -name 'libnccl.so.2' 2>/dev/null | head -1)
  [ -n "$lib" ] && export CUBESIM_NCCL_LIBRARY="$lib"
fi
{
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  nvidia-smi topo -m
  echo "nccl: $(ldconfig -p | grep libnccl.so.2 | head -1) ${CUBESIM_NCCL_LIBRARY:-}"
  date -u +%Y-%m-%dT%H:%M:%SZ
} 2>&1 | tee "$OUT/gpu.txt"
what=${*:-smoke xcheck test}
rc=0
for w in $what; do
  case $w in
    smoke)
      timeout 90 "$BIN/test_runtime_cuda" --gtest_filter='CudaBackendErrors.*:CudaKernels.*:CudaRing.*:*CudaRingCollectives*all_reduce_ring_bf16_4ranks_n1031*:*CudaNcclCollectives*all_reduce_ring_bf16_4ranks_n4160*:*CudaMlp*tp2_nosp*' \
        > "$OUT/smoke.log" 2>&1 || rc=1
      grep -E '^\[  (PASSED|FAILED) |FAILED|Failure|error|rror:' "$OUT/smoke.log" | head -30 ;;
    xcheck)
      timeout 240 "$BIN/cubesim-xcheck" --json "$OUT/xcheck.json" ${XCHECK_ARGS:-} > "$OUT/xcheck.log" 2>&1 || rc=1
      cat "$OUT/xcheck.log" | tail -80 ;;
    test)
      timeout 200 "$BIN/test_runtime_cuda" --gtest_filter="${GTEST_FILTER:-*}" > "$OUT/test.log" 2>&1 || rc=1
      grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|Failure' "$OUT/test.log" | head -40 ;;
  esac
done
exit $rc
