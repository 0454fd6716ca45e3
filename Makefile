# SPDX-License-Identifier: Apache-2.0
# kvxfer: every target installs what it needs (scripts/install-deps.sh),
# configures and builds on its own.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo bench microbench test test-slow test-all test-unit test-integration test-python install package wheel clean

all: build

# NO_DEPS=1 skips the package check (.ci/run checks once, then passes it).
NO_DEPS ?=
deps:
ifeq ($(NO_DEPS),)
	bash scripts/install-deps.sh
endif

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The main job: `kvxfer bench` with its defaults -- a target and an initiator
# on this machine, 1 GiB regions, the reference workloads over UCX shared
# memory, every case verified byte for byte, ratios to memcpy and perftest.
demo: build
	$(BUILD)/tools/kvxfer bench

# The scoreboard: the reference workloads (docs/workloads.md) over
# shared memory, against memcpy and ucx_perftest, every case verified.
# BENCH_ARGS passes options, e.g. make bench BENCH_ARGS="--tls tcp --json out.json".
BENCH_ARGS ?=
bench: build
	$(BUILD)/tools/kvxfer bench $(BENCH_ARGS)

# Per-call overhead on the loopback engine (Google Benchmark).
microbench: build
	$(BUILD)/bench/kvxfer_transport_bench

# Test tiers (labels; tests/CMakeLists.txt says which test has which):
#   unit, integration, python  what `make test` runs, on every change;
#   slow      long rounds: the full stale-write budgets, the soak, netns
#             keepalive, the huge-pool bench smoke (`make test-slow`);
#   package   the pip and Debian install routes, from one package build
#             (`make test-slow` too);
#   timing    tests whose verdict rests on wall-clock bounds: not run under
#             a sanitizer, which slows every instruction;
#   wire      wire-format and corpus replays: one sanitizer (ASan) runs them.
# Tests that need the machine's cores to themselves hold the `cores`
# resource lock (or run serially); the others run CTEST_JOBS at a time.
CTEST_JOBS ?= 2
CTEST = ctest --test-dir $(BUILD) --output-on-failure -j$(CTEST_JOBS)

test: build
	$(CTEST) --timeout 600 -LE 'slow|package'

test-slow: build
	$(CTEST) --timeout 1200 -L 'slow|package'

test-all: build
	$(CTEST) --timeout 1200

test-unit: build
	$(CTEST) -L 'unit|wire' -LE slow

test-integration: build
	$(CTEST) -L integration -LE slow

test-python: build
	$(CTEST) -L python

install: build
	cmake --install $(BUILD)

# Debian packages (libkvxfer0, libkvxfer-dev, python3-kvxfer, kvxfer) in
# $(PKG_BUILD), from a tree of their own: prefix /usr puts the library in
# /usr/lib/<triplet> and the module in /usr/lib/python3/dist-packages, which
# the $(BUILD) tree (prefix /usr/local) does not. See cmake/packaging.cmake;
# install with `apt install ./$(PKG_BUILD)/*.deb`. The install paths are
# worked out afresh (-U) in case the tree built a wheel before (the package
# tests build both in one tree). RelWithDebInfo, as the build tree: the
# packages carry the code the tests ran (stripped, cmake/packaging.cmake), and
# with ccache the two trees share their objects.
PKG_BUILD ?= build-pkg
package: deps
	cmake -S . -B $(PKG_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
	  -UCMAKE_INSTALL_LIBDIR -UKVXFER_PYTHON_INSTALL_DIR -DPython_EXECUTABLE=/usr/bin/python3 \
	  -DKVXFER_BUILD_TESTS=OFF -DKVXFER_BUILD_BENCH=OFF -DKVXFER_BUILD_TOOLS=ON -DKVXFER_BUILD_PYTHON=ON
	cmake --build $(PKG_BUILD) -j$(JOBS)
	cd $(PKG_BUILD) && cpack -G DEB

# A wheel of the Python package (the extension, libkvxfer and the kvxfer
# tool), built once (minutes; pip -v shows CMake's progress) by Debian's
# python3 with its pip, setuptools and wheel, offline, into $(WHEEL_DIR).
# `venv/bin/pip install --no-index $(WHEEL_DIR)/kvxfer-*.whl` then installs it
# in seconds, without a compiler, into any venv of that python3 on the same
# OS (Debian 12 with the runtime libraries: libucx0, libssl3, libspdlog,
# libfmt; python3-numpy). setup.py's CMake tree (build/pip) is kept, so
# the next `make wheel` rebuilds only what changed.
WHEEL_DIR ?= $(BUILD)/wheel
wheel: deps
	/usr/bin/python3 -m pip wheel -v --no-build-isolation --no-index --no-deps -w $(WHEEL_DIR) .

clean:
	rm -rf $(BUILD) $(PKG_BUILD)

# Sanitizer runs of the C++ suites (unit + integration), built without the
# command, the benchmarks, the Python module or the soak, which they do not
# test. Neither runs the slow tier (CI runs it once, in the release build)
# or the timing tests; only ASan runs the wire tests (their parsers have no
# threads for TSan to watch; the fuzz corpora run under ASan and UBSan in
# `make fuzz`, their verdicts in `make test`), and only TSan runs the
# netns program (about 30 s, alone: its link cuts and freezes are thread
# races first; under ASan the integration program covers the same lane code
# on loopback). The integration program runs as three gtest shards beside
# the other programs (tests/CMakeLists.txt, kvxfer_test_program); the ASan
# build leaves the netns program out (KVXFER_BUILD_NETNS_TESTS=OFF). UCX's
# memory hooks fight ASan's allocator, so they are off in these runs.
SAN_ENV = UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
SAN_FLAGS = -DCMAKE_BUILD_TYPE=Debug -DKVXFER_BUILD_PYTHON=OFF -DKVXFER_BUILD_BENCH=OFF \
  -DKVXFER_BUILD_TOOLS=OFF -DKVXFER_BUILD_SOAK=OFF

.PHONY: test-asan test-tsan fuzz tsa
test-asan: deps
	cmake -S . -B build-asan $(SAN_FLAGS) -DKVXFER_BUILD_CORPUS_REPLAYS=OFF \
	  -DKVXFER_BUILD_NETNS_TESTS=OFF -DKVXFER_SANITIZE=address
	cmake --build build-asan -j$(JOBS)
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build-asan --output-on-failure -j$(CTEST_JOBS) -L 'unit|integration|wire' \
	  -LE 'slow|timing' --timeout 900

test-tsan: deps
	cmake -S . -B build-tsan $(SAN_FLAGS) -DKVXFER_BUILD_WIRE_TESTS=OFF -DKVXFER_SANITIZE=thread
	cmake --build build-tsan -j$(JOBS)
	$(SAN_ENV) TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp \
	  ctest --test-dir build-tsan --output-on-failure -j$(CTEST_JOBS) -L 'unit|integration' \
	  -LE 'slow|timing' --timeout 900

# Clang's thread-safety analysis of the library (not the tests, tool or
# module): the one-lock rule is written as annotations (GUARDED_BY, REQUIRES,
# EXCLUDES; src/common/thread_annotations.h), and a broken one is an error
# here; clang's other warnings stay warnings in this stage. Unoptimised and
# without debug info: only the front end's verdict matters.
TSA_BUILD ?= build-tsa
tsa: deps
	CC=clang CXX=clang++ cmake -S . -B $(TSA_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DCMAKE_CXX_FLAGS="-Wthread-safety -Werror=thread-safety" \
	  -DKVXFER_WERROR=OFF -DKVXFER_BUILD_TESTS=OFF -DKVXFER_BUILD_TOOLS=OFF \
	  -DKVXFER_BUILD_BENCH=OFF -DKVXFER_BUILD_PYTHON=OFF
	cmake --build $(TSA_BUILD) -j$(JOBS) --target kvxfer

# libFuzzer targets (clang), each run for FUZZ_SECONDS on its seed corpus,
# FUZZ_JOBS at a time (CI: 7 s each, two at a time; `make test` replays
# every corpus input as a regression test).
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
FUZZERS = metadata handshake ack fence notify cookie ucx_blob loopback_blob tcp_frame
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DKVXFER_FUZZ=ON -DKVXFER_BUILD_PYTHON=OFF \
	  -DKVXFER_BUILD_BENCH=OFF -DKVXFER_BUILD_TOOLS=OFF -DKVXFER_BUILD_SOAK=OFF \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build-fuzz -j$(JOBS) $(addprefix --target ,$(addsuffix _fuzz,$(FUZZERS)))
	printf '%s\n' $(FUZZERS) | xargs -P $(FUZZ_JOBS) -I{} bash scripts/fuzz-one.sh build-fuzz {} $(FUZZ_SECONDS)

# The soak (not in CI; CTest runs a 40-second version as soak.short):
# SOAK_MINUTES of random traffic against three target processes, one killed
# at random, every done block verified. Prints a summary; fails on any
# corrupt block, live handle after close, or RSS growth past the bound.
SOAK_MINUTES ?= 10
SOAK_SEED ?= 1
.PHONY: soak
soak: build
	$(BUILD)/tests/soak/kvxfer_soak --seconds $$(( $(SOAK_MINUTES) * 60 )) --seed $(SOAK_SEED)
