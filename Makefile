# SPDX-License-Identifier: MIT
# Thin wrapper over CMake. The two commands of README.md:
#   make run    install what is missing, fetch the model once, build, and run
#               the main job: SmolLM2-135M generating through the store
#   make test   install what is missing, fetch the model once, build with
#               -Werror and run ctest, rebuild with ASan+UBSan (leak detection
#               on) and run ctest again, then run the libFuzzer targets
# make test also runs scripts/setup_hf.sh (setup-hf): a cached venv with torch
# and transformers for the kvpage.transformers tests (KVPAGE_NO_HF=1 skips it).
# Other targets: build, model, demo, bench, fuzz, fuzz-campaign, tsan, install,
# clean.
#   make bench  every benchmark in the default build, and kvbench-attn in the
#               default build and a Release build (build-release/) side by
#               side (scripts/bench_builds.sh)
# Variables: JOBS (build parallelism), FUZZ_SECONDS (per fuzz target),
# FUZZ_TARGETS / CAMPAIGN_SECONDS (fuzz-campaign), PREFIX (make install:
# cmake --install build --prefix $(PREFIX)).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
RELEASE_BUILD ?= build-release
FUZZ_SECONDS ?= 20
PREFIX ?= /usr/local

.PHONY: all setup setup-hf model build run demo test test-plain test-asan fuzz bench install clean

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

# A failed install (no network, no disk) does not stop the tests: the
# transformers suite then skips (77) and says why.
setup-hf:
	@bash scripts/setup_hf.sh || echo "WARNING: scripts/setup_hf.sh failed: the kvpage.transformers tests will be skipped"

test-plain: build model setup-hf
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
	rm -rf $(BUILD) $(ASAN_BUILD) $(RELEASE_BUILD) $(TSAN_BUILD) build-fuzz

# A long fuzz campaign (fuzz/README.md): every target of FUZZ_TARGETS for
# CAMPAIGN_SECONDS each, one after the other, the corpus kept in
# build-fuzz/corpus/. One target for an hour:
#   make fuzz-campaign FUZZ_TARGETS=fuzz_restore CAMPAIGN_SECONDS=3600
FUZZ_TARGETS ?= fuzz_pages fuzz_pagefile fuzz_restore fuzz_spec
CAMPAIGN_SECONDS ?= 3600

.PHONY: fuzz-campaign
fuzz-campaign: setup
	bash fuzz/build.sh $(CAMPAIGN_SECONDS) $(FUZZ_TARGETS)

# ThreadSanitizer over the tests that run threads (the allocator's caches,
# the metadata allocator, the worker pool, multi-threaded attention, async
# page-file I/O, attention racing page-ins): build-tsan/, TSan halting on
# the first report.
TSAN_BUILD ?= build-tsan
TSAN_TESTS ?= alloc_threads mem pool attn_cpu offload_async store_offload_wait api_formats

.PHONY: tsan
tsan: setup
	cmake -S . -B $(TSAN_BUILD) -DKV_WERROR=ON -DKV_TSAN=ON
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(addprefix test_,$(TSAN_TESTS))
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS) \
	  -R '^(unit|integration)/($(subst $(eval) ,|,$(TSAN_TESTS)))$$'
