# spikeguard: two commands.
#   make demo   the daemon supervising a demo run (installs, builds, runs)
#   make test   the test suite (installs, builds, runs ctest)
#   make demo-torch  a user's own PyTorch loop and dataset under spikeguard.supervise
#                    (2 DDP ranks): garbage samples named down to their documents
#   make check-sanitize  (part of make test) the clang build: ASan+UBSan unit and
#                    bad-input tests, -Werror=thread-safety, fuzzers' bounded runs
#   make fuzz        every fuzz target for FUZZ_SECONDS (60) each
BUILD ?= build
GENERATOR ?= Ninja
CTEST_ARGS ?=
# The checking build (cmake/Sanitize.cmake): clang, ASan+UBSan, thread-safety
# analysis, libFuzzer. SANITIZE=0 leaves it out of `make test`.
SAN_BUILD ?= build-clang
SANITIZE ?= 1
# Warnings in our own sources are errors in both builds (CMake option
# SPIKEGUARD_WERROR; generated proto code and system headers are outside it).
# WERROR=OFF when trying a compiler newer than CI's gcc 12 / clang 14.
WERROR ?= ON
FUZZ_SECONDS ?= 60
# The compiler cache (CMakeLists.txt): hash paths relative to this checkout,
# so a clean clone in another folder hits the objects of an earlier build.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1
export CCACHE_MAXSIZE ?= 8G
# What the checking build leaves out: Python (an ASan-built extension cannot
# load into Debian's python3), end-to-end scenarios and benchmarks (minutes of
# real processes; the main build runs them), the browser and Slurm tests
# (real daemons, workers and jobs).
SAN_SKIP = worker/python;tests/e2e;tests/bench;tests/python;tests/deploy;tests/http;tests/slurm
# Debian's gRPC/protobuf/Abseil are not instrumented: container-overflow
# annotations are unreliable across that boundary. Leaks are checked, minus
# the libraries' own process-lifetime allocations (tests/fuzz/lsan.supp).
SAN_ENV = ASAN_OPTIONS=detect_container_overflow=0:detect_leaks=1:strict_init_order=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/fuzz/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: all deps configure build test demo demo-torch bench clean check-sanitize sanitize-build fuzz

all: build

deps:
	@./deploy/stage.sh deps ./deploy/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G $(GENERATOR) -DSPIKEGUARD_WERROR=$(WERROR)

configure: deps $(BUILD)/build.ninja

build: configure
	@./deploy/stage.sh build cmake --build $(BUILD)

test: build
	@./deploy/stage.sh ctest ctest --test-dir $(BUILD) --output-on-failure --label-exclude bench -j2 --timeout 900 $(CTEST_ARGS)
ifneq ($(SANITIZE),0)
	$(MAKE) check-sanitize
endif

$(SAN_BUILD)/build.ninja: | deps
	cmake -S . -B $(SAN_BUILD) -G $(GENERATOR) -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=Sanitize -DSPIKEGUARD_SANITIZE=ON "-DSPIKEGUARD_SKIP=$(SAN_SKIP)" \
	  -DSPIKEGUARD_WERROR=$(WERROR)

# nice: the checking build yields the CPU to interactive builds.
sanitize-build: deps $(SAN_BUILD)/build.ninja
	@./deploy/stage.sh sanitize-build nice -n 10 cmake --build $(SAN_BUILD)

# Unit and bad-input tests under ASan+UBSan, then each fuzz target's
# regression inputs and a bounded run (label fuzz, SPIKEGUARD_FUZZ_SECONDS=5).
# Building at all is the thread-safety check (-Werror=thread-safety).
# Under ASan the daemon runs a few times slower, and a few tests with 30 s
# deadlines (a 600x1024 telemetry stream, hello deadlines) can miss them on a
# loaded 2-core machine: a failed test gets one more try (a sanitizer report
# fails both).
check-sanitize: sanitize-build
	@$(SAN_ENV) ./deploy/stage.sh sanitize-ctest ctest --test-dir $(SAN_BUILD) --output-on-failure --label-exclude 'bench|e2e|scenario' \
	  -j2 --timeout 900 --repeat until-pass:2 $(CTEST_ARGS)

# Longer fuzzing: every target for FUZZ_SECONDS; new inputs stay in
# $(SAN_BUILD)/tests/fuzz/work, crashes in .../work/crashes/TARGET/.
fuzz: sanitize-build
	@set -e; for t in $$(ls tests/fuzz/*_fuzz.cc); do n=$$(basename $$t .cc); \
	  $(SAN_ENV) ./tests/fuzz/run_fuzzer.sh --replay $(SAN_BUILD)/tests/fuzz/$$n tests/fuzz $(SAN_BUILD)/tests/fuzz/work; \
	  $(SAN_ENV) ./tests/fuzz/run_fuzzer.sh $(SAN_BUILD)/tests/fuzz/$$n tests/fuzz $(SAN_BUILD)/tests/fuzz/work $(FUZZ_SECONDS); \
	done

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
