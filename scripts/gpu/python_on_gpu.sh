#!/usr/bin/env bash
# Runs the Python package on the GPU machine (built for its Python by scripts/gpu/stage_python_module.sh,
# carried in gpu-out/python): the numerics tool's cuda variants and their test, and the sweep
# throughput benchmark with MPI on that machine's cores. Logs and JSON go to $OUT (or ./out).
#   scripts/gpu/python_on_gpu.sh [numerics] [sweep] [pytest]      (default: numerics sweep)
# Environment: SWEEP_CASES (default 4000), SWEEP_JOBS (default: the cores), SWEEP_MPI (default 1,2,4,8,
# then cores-1 workers: rank 0 leads), SWEEP_MPI_CASES (cases per MPI worker, default 300).
set -u -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="${PYPATH:-$PWD/gpu-out/python}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUBESIM_TOPOLOGY_DIR="$PWD/topologies"
if ! ldconfig -p | grep -q 'libnccl.so.2 '; then
  lib=$(find /usr/local /usr/lib /opt -name 'libnccl.so.2' 2>/dev/null | head -1)
  [ -n "$lib" ] && export CUBESIM_NCCL_LIBRARY="$lib"
fi
cores=$(nproc)
{
  nvidia-smi --query-gpu=index,name,driver_version --format=csv 2>/dev/null
  echo "cores: $cores; $(grep -m1 'model name' /proc/cpuinfo)"
  $PY -c "import sys, cubesim as cs; print(sys.version.split()[0], [(b['name'], b['available'], b['devices']) for b in cs.backend_info()])"
  mpirun --version 2>/dev/null | head -1
  date -u +%Y-%m-%dT%H:%M:%SZ
} 2>&1 | tee "$OUT/machine.txt"
rc=0
for w in ${*:-numerics sweep}; do
  case $w in
    numerics)
      timeout 300 $PY -m pytest -q -p no:cacheprovider tests/python/test_numerics.py > "$OUT/numerics_test.log" 2>&1 || rc=1
      tail -3 "$OUT/numerics_test.log"
      timeout 300 $PY -m cubesim numerics --config examples/numerics/bf16_vs_fp32.json --output-dir "$OUT/numerics" \
        > "$OUT/numerics.log" 2>&1 || rc=1
      sed -n '/rms_rel against/,$p' "$OUT/numerics.log" ;;
    sweep)
      mpi=${SWEEP_MPI:-1,2,4,8,$((cores - 1))}
      timeout 500 $PY -m cubesim sweep bench --cases "${SWEEP_CASES:-4000}" --jobs "${SWEEP_JOBS:-$cores}" \
        --mpi "$mpi" --mpi-cases "${SWEEP_MPI_CASES:-300}" --json "$OUT/sweep_bench.json" > "$OUT/sweep_bench.log" 2>&1 || rc=1
      tail -14 "$OUT/sweep_bench.log" ;;
    pytest)
      timeout 300 $PY -m pytest -q -p no:cacheprovider -rf --maxfail=20 tests/python > "$OUT/pytest.log" 2>&1 || rc=1
      grep -E "^FAILED|passed|failed" "$OUT/pytest.log" | tail -25 ;;
  esac
done
exit $rc
