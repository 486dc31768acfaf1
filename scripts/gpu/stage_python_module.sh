#!/usr/bin/env bash
# Builds the cubesim Python package, cuda backend included, for the GPU machine's Python (3.12 there,
# 3.11 here) and puts it in gpu-out/python (git-ignored; the `run` tool carries gpu-out/). There:
#   PYTHONPATH=gpu-out/python python3 -m cubesim ...      (numerics with cuda variants, sweeps on MPI)
# The machine's own headers are needed here, once: copy them off it with one call, e.g.
#   tar czf $OUT/py312.tgz -C / usr/include/python3.12 usr/include/x86_64-linux-gnu/python3.12 \
#       opt/torch/.venv/lib/python3.12/site-packages/pybind11/include
# and unpack that under PY_ROOT (default /tmp/py312). The C++ libraries come from build-cu/ (Release,
# CUDA on; scripts/gpu/stage_cuda_backend.sh configures it); static cudart and Boost.Context, NCCL by
# dlopen there, as for the other GPU binaries. libstdc++ is the machine's own (newer than this one's);
# STATIC_CXX=1 links this machine's into the module instead. OUT_DIR: another folder than gpu-out/python.
# BUILD: the build folder whose libraries go in (default build-cu; the default `build` works too where
# CMake found nvcc here, as it does on this machine: enough for sweeps, which run no GPU code).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY_ROOT=${PY_ROOT:-/tmp/py312}
PY_VER=${PY_VER:-3.12}
PY_INC="$PY_ROOT/usr/include/python$PY_VER"
PB_INC=$(find "$PY_ROOT" -path '*pybind11/include' -type d | head -1)
[ -f "$PY_INC/Python.h" ] || { echo "no Python.h under $PY_INC: copy the GPU machine's headers first (see the top of $0)" >&2; exit 2; }
[ -n "$PB_INC" ] || { echo "no pybind11/include under $PY_ROOT (see the top of $0)" >&2; exit 2; }
b=${BUILD:-build-cu}
[ -f $b/CMakeCache.txt ] || cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DCUBESIM_BUILD_PYTHON=OFF -DCUBESIM_CUDA=ON
cmake --build $b --target cubesim_runtime_cuda cubesim_backends cubesim_tp cubesim_sdc -j2
suffix=".cpython-${PY_VER/./}-x86_64-linux-gnu.so"
out=${OUT_DIR:-gpu-out/python}/cubesim
obj=$b/py${PY_VER/./}
mkdir -p "$out" "$obj"
flags=(-O2 -DNDEBUG -fPIC -fvisibility=hidden -std=c++20 -ffp-contract=off -fno-fast-math
       -DFMT_HEADER_ONLY=1 -DCUBESIM_PY_HAVE_CUDA=1 -I. -isystem "$PY_INC" -isystem "$PY_ROOT/usr/include" -isystem "$PB_INC"
       -isystem /usr/local/cuda/include)
objs=()
pids=()
for src in python/src/*.cpp; do
  o="$obj/$(basename "${src%.cpp}").o"
  # Any header of the project, not only the bindings': an inline member of a class whose layout changed
  # (sim/core/event_queue.h) compiled into an old object beside the new libraries corrupts memory.
  if [ ! -f "$o" ] || [ "$src" -nt "$o" ] || [ -n "$(find python/src base sim kernels runtime tp sdc -name '*.h' -newer "$o" | head -1)" ]; then
    echo "compiling $src"
    rm -f "$o"  # a failed compile must not leave the old object to be linked
    g++ "${flags[@]}" -c "$src" -o "$o" &
    pids+=($!)
    # two at a time (this machine has two cores)
    [ "$(jobs -r | wc -l)" -ge 2 ] && { wait -n || { echo "a compile failed" >&2; wait; exit 1; }; }
  fi
  objs+=("$o")
done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
for o in "${objs[@]}"; do [ -f "$o" ] || { echo "not compiled: $o" >&2; exit 1; }; done
g++ -shared -o "$out/_cubesim$suffix" "${objs[@]}" \
  $b/sdc/libcubesim_sdc.a $b/tp/libcubesim_tp.a $b/runtime/libcubesim_backends.a $b/runtime/libcubesim_runtime_cuda.a \
  $b/kernels/cuda/libcubesim_kernels_cuda.a $b/runtime/libcubesim_runtime.a $b/kernels/libcubesim_kernels.a \
  $b/sim/hw/libcubesim_sim_hw.a $b/sim/libcubesim_sim_core.a /usr/lib/x86_64-linux-gnu/libboost_context.a \
  $b/base/libcubesim_base.a -L/usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib/libcudart_static.a \
  -lcudadevrt -lrt -lpthread -ldl ${STATIC_CXX:+-static-libstdc++ -static-libgcc}
# Python's own symbols are resolved when the module loads; none of cubesim's may be left undefined.
if nm -D --undefined-only "$out/_cubesim$suffix" | grep ' U .*cubesim'; then
  echo "the module leaves cubesim symbols undefined (above)" >&2
  exit 1
fi
strip --strip-unneeded "$out/_cubesim$suffix"
cp python/cubesim/*.py "$out/"
ls -la "$out"
