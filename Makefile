# Thin wrapper over CMake. The two commands of README.md:
#   make run    install what is missing, fetch the model once, build, and run
#               the main job: SmolLM2-135M generating through the store
#   make test   install what is missing, fetch the model once, build with
#               -Werror and run ctest, rebuild with ASan+UBSan (leak detection
#               on) and run ctest again, then run the libFuzzer targets
# Other targets: build, model, demo, bench, fuzz, install, clean.
#   make bench  every benchmark in the default build, and kvbench-attn in the
#               default build and a Release build (build-release/) side by
#               side (scripts/bench_builds.sh)
# Variables: JOBS (build parallelism), FUZZ_SECONDS (per fuzz target),
# PREFIX (make install: cmake --install build --prefix $(PREFIX)).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
RELEASE_BUILD ?= build-release
FUZZ_SECONDS ?= 20
PREFIX ?= /usr/local

.PHONY: all setup model build run demo test test-plain test-asan fuzz bench install clean

all: build

setup:
	@bash scripts/setup.sh

model: setup
	@bash scripts/fetch_model.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DKV_WERROR=ON

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build model
	./$(BUILD)/bin/kvpage run

demo: build
	./$(BUILD)/bin/kvpage demo

test-plain: build model
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: setup model
	cmake -S . -B $(ASAN_BUILD) -DKV_WERROR=ON -DKV_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

fuzz: setup
	bash fuzz/build.sh $(FUZZ_SECONDS)

test: test-plain test-asan fuzz

bench: build model
	cmake -S . -B $(RELEASE_BUILD) -DCMAKE_BUILD_TYPE=Release -DKV_WERROR=ON
	cmake --build $(RELEASE_BUILD) -j $(JOBS) --target kvbench-attn
	./$(BUILD)/bin/kvbench-alloc --json
	./$(BUILD)/bin/kvbench-offload --json
	./$(BUILD)/bin/kvbench-model --json
	./$(BUILD)/bin/kvbench-hash --json
	./$(BUILD)/bin/kvbench-remote --json
	BUILD=$(BUILD) RELEASE_BUILD=$(RELEASE_BUILD) bash scripts/bench_builds.sh

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(RELEASE_BUILD) build-fuzz
