#!/usr/bin/env bash
# Runs the det_gemm CUDA tests and benchmark on the GPU machine (the `run` tool of this workplace) from
# binaries built here and carried in gpu-out/ (scripts/gpu/stage_det_gemm_cuda.sh). Writes logs and
# the bench JSON under $OUT (or ./out). A smoke test of the tensor-core kernel runs first, under a
# short timeout: if it hangs or fails, compute-sanitizer looks at it and the rest skips that mode.
#   scripts/gpu/det_gemm_cuda.sh [smoke] [test] [bench] [sass]     (default: all four)
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
BIN=${BIN:-gpu-out}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
what=${*:-smoke test bench sass}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/gpu.txt"
rc=0
tc_ok=1
for w in $what; do
  case $w in
    smoke)
      timeout 60 "$BIN/test_det_gemm_cuda" --gtest_filter='CudaGemmTc.EveryLayoutGivesTheSameBits:CudaGemm.ExactKZeroWritesBiasOnly' 2>&1 | tail -5
      s=$?
      if [ $s -ne 0 ]; then
        echo "SMOKE FAILED (rc $s): tensor-core mode skipped below; compute-sanitizer on it:"
        tc_ok=0
        rc=1
        timeout 120 compute-sanitizer --tool memcheck "$BIN/test_det_gemm_cuda" --gtest_filter='CudaGemmTc.EveryLayoutGivesTheSameBits' 2>&1 | tail -40
      fi ;;
    test)
      filter=${GTEST_FILTER:-*}
      [ $tc_ok = 1 ] || filter="$filter:-CudaGemmTc.*:CudaTc/*"
      timeout 240 "$BIN/test_det_gemm_cuda" --gtest_filter="$filter" > "$OUT/test.log" 2>&1 || rc=1
      grep -v '^\[ RUN\|^\[       OK\|^\[  SKIPPED\|^$' "$OUT/test.log" | tail -60 ;;
    bench)
      extra=${BENCH_ARGS:-}
      [ $tc_ok = 1 ] || extra="$extra --no-tc"
      timeout 300 "$BIN/bench_det_gemm_cuda" --json "$OUT/bench.json" $extra > "$OUT/bench.log" 2>&1 || rc=1
      tail -30 "$OUT/bench.log" ;;
    sass)
      if command -v cuobjdump >/dev/null; then
        cuobjdump -sass "$BIN/bench_det_gemm_cuda" > "$OUT/sass.txt" 2>&1
        echo "SASS: HGMMA $(grep -c HGMMA "$OUT/sass.txt"), FFMA $(grep -c FFMA "$OUT/sass.txt"), LDL/STL $(grep -c 'LDL\|STL' "$OUT/sass.txt")"
        gzip -f "$OUT/sass.txt"
      fi ;;
  esac
done
exit $rc
