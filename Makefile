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

# The GoogleTest suites under AddressSanitizer and UBSan, in a build folder of their own.
asan-test: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUBESIM_SANITIZE=ON \
	  -DCUBESIM_BUILD_PYTHON=OFF -DCUBESIM_BUILD_BENCHES=OFF -DCUBESIM_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) build-asan
