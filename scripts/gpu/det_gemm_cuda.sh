#!/usr/bin/env bash
# Runs the det_gemm CUDA tests and benchmark on the GPU machine (the `run` tool of this workplace) from
# binaries built here and carried in gpu-out/ (see scripts/gpu/stage_det_gemm_cuda.sh), or rebuilt
# there with its nvcc when they do not load. Writes logs and bench JSON under $OUT (or ./out).
#   scripts/gpu/det_gemm_cuda.sh [test|bench|sass|all]...
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
BIN=${BIN:-gpu-out}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
# cuBLAS from the Python wheels, should the toolkit's be missing.
for d in $(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null); do
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
what=${*:-all}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/gpu.txt"
rc=0
for w in $what; do
  case $w in
    test|all)
      timeout 400 "$BIN/test_det_gemm_cuda" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} 2>&1 | tee "$OUT/test.log" | grep -v "^\[ RUN\|^\[       OK" || rc=1 ;;&
    bench|all)
      timeout 400 "$BIN/bench_det_gemm_cuda" --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || rc=1 ;;&
    sass|all)
      if command -v cuobjdump >/dev/null; then
        cuobjdump -sass "$BIN/bench_det_gemm_cuda" > "$OUT/sass.txt" 2>&1
        echo "HGMMA: $(grep -c HGMMA "$OUT/sass.txt")  FFMA: $(grep -c FFMA "$OUT/sass.txt")  LDL/STL: $(grep -c 'LDL\|STL' "$OUT/sass.txt")"
        gzip -f "$OUT/sass.txt"
      fi ;;
  esac
done
exit $rc
