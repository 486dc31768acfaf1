# Quick start: `make demo` and `make test`. Everything else is a convenience.
BUILD   ?= build
JOBS    ?= $(shell nproc)
PYTHON  ?= /usr/bin/python3
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test asan-test clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job: `cubesim run` on the default topology (a ParallelMLP step checked against the host
# reference). DEMO_ARGS go to it, e.g. make demo DEMO_ARGS="--topology ring4 --trace run.json".
demo: build
	$(BUILD)/bin/cubesim run $(DEMO_ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	PYTHONPATH=$(BUILD)/python $(PYTHON) -m pytest -q tests/python

# The GoogleTest suites under AddressSanitizer and UBSan, in a build folder of their own; then the
# Python API's fuzzer and hardening tests against the same sanitized module (the sanitizer runtimes
# preloaded into Debian's python3, which is not built with them; Python's own allocations at exit
# are not ours to report, so leak detection is off there).
ASAN_PRELOAD = $(shell $(CXX) -print-file-name=libasan.so) $(shell $(CXX) -print-file-name=libubsan.so)
asan-test: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUBESIM_SANITIZE=ON \
	  -DCUBESIM_BUILD_PYTHON=ON -DCUBESIM_BUILD_BENCHES=OFF -DCUBESIM_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)
	CUBESIM_FUZZ_CASES=3000 LD_PRELOAD="$(ASAN_PRELOAD)" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  PYTHONPATH=build-asan/python $(PYTHON) -m pytest -q -p no:cacheprovider \
	  tests/python/test_fuzz_api.py tests/python/test_api_hardening.py

clean:
	rm -rf $(BUILD) build-asan
