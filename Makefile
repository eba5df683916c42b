# Thin wrapper over CMake. The two commands of README.md:
#   make run    install what is missing, build, run the main job (kvpage demo)
#   make test   install what is missing, build with -Werror and run ctest, then
#               build with ASan+UBSan (leak detection on) and run ctest again
# Other targets: build, bench, clean. JOBS sets build parallelism.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan

.PHONY: all setup build run test test-plain test-asan bench clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DKV_WERROR=ON

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/bin/kvpage demo

test-plain: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: setup
	cmake -S . -B $(ASAN_BUILD) -DKV_WERROR=ON -DKV_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

test: test-plain test-asan

bench: build
	./$(BUILD)/bin/kvbench-alloc --json
	./$(BUILD)/bin/kvbench-attn --json

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
