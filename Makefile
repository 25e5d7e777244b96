# spikeguard: two commands.
#   make demo   the daemon supervising a demo run (installs, builds, runs)
#   make test   the test suite (installs, builds, runs ctest)
#   make demo-torch  the demo's incident with the PyTorch trainer (2 DDP ranks)
BUILD ?= build
GENERATOR ?= Ninja
CTEST_ARGS ?=

.PHONY: all deps configure build test demo demo-torch bench clean

all: build

deps:
	@./deploy/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G $(GENERATOR)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD)

test: build
	ctest --test-dir $(BUILD) --output-on-failure --label-exclude bench -j2 --timeout 900 $(CTEST_ARGS)

demo: build
	./deploy/demo.sh $(BUILD)

# The same incident with the PyTorch trainer: two torch.distributed ranks.
demo-torch: build
	./deploy/demo.sh $(BUILD) torch

# Every benchmark, with a markdown summary in $(BUILD)/bench-results/SUMMARY.md.
bench: build
	./tests/bench/run_all.sh $(BUILD) $(BUILD)/bench-results

clean:
	rm -rf $(BUILD)
