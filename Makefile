# kvxfer: every target installs what it needs (scripts/install-deps.sh),
# configures and builds on its own.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-unit test-integration test-python install clean

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The main job: a target and an initiator on this machine, 1 GiB pools,
# random blocks written over UCX and verified byte for byte.
demo: build
	$(BUILD)/tools/kvxfer demo

test: build
	ctest --test-dir $(BUILD) --output-on-failure --timeout 600

test-unit: build
	ctest --test-dir $(BUILD) --output-on-failure -L unit

test-integration: build
	ctest --test-dir $(BUILD) --output-on-failure -L integration

test-python: build
	ctest --test-dir $(BUILD) --output-on-failure -L python

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD)
