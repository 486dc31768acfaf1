#!/usr/bin/env bash
# Same-run A/B of the exact det_gemm on the GPU machine: the tests of the new build, then
# `bench_det_gemm_cuda --exact-layouts-only` alternating the old build, the new one and the new one
# with its register staging forced (CUBESIM_EXACT_STAGING=registers), ROUNDS times.
#   OLD=dir NEW=dir [ROUNDS=2] scripts/gpu/det_gemm_exact_ab.sh     (logs and JSON under $OUT)
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
for f in "$OLD"/*.gz "$NEW"/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x "$OLD"/* "$NEW"/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/gpu.txt"
rc=0
t0=$(date +%s)
timeout 300 "$NEW/test_det_gemm_cuda" > "$OUT/test_new.log" 2>&1 || rc=1
grep -v '^\[ RUN\|^\[       OK\|^\[  SKIPPED\|^$' "$OUT/test_new.log" | tail -25
echo "tests: $(( $(date +%s) - t0 )) s"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in old new regs; do
    bin=$NEW; env=""
    [ $v = old ] && bin=$OLD
    [ $v = regs ] && env="CUBESIM_EXACT_STAGING=registers"
    env $env timeout 200 "$bin/bench_det_gemm_cuda" --exact-layouts-only --no-tc --json "$OUT/bench_${v}_$r.json" \
      > "$OUT/bench_${v}_$r.log" 2>&1 || rc=1
    echo "== $v round $r"; grep -A16 'exact mode by dtype' "$OUT/bench_${v}_$r.log"
  done
done
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv | tee -a "$OUT/gpu.txt"
exit $rc
