# The checking build (`make check-sanitize`, build dir build-clang): one clang
# build that gives three checks for the price of one compile:
#   - AddressSanitizer + UndefinedBehaviorSanitizer on every target (UB aborts:
#     -fno-sanitize-recover=undefined),
#   - clang's thread-safety analysis of the ABSL_GUARDED_BY / ABSL_LOCKS_*
#     annotations as errors (-Wthread-safety -Werror=thread-safety),
#   - libFuzzer coverage on everything (-fsanitize=fuzzer-no-link), so the
#     fuzz targets of tests/fuzz see our libraries' edges.
#
#   cmake -S . -B build-clang -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
#         -DCMAKE_C_COMPILER=clang -DSPIKEGUARD_SANITIZE=ON
#
# Debian's gRPC, protobuf and Abseil stay uninstrumented (built by g++ against
# the same libstdc++, so they link as they are). Two consequences, handled by
# the Makefile's ASAN_OPTIONS: container-overflow annotations cannot be trusted
# across instrumented/uninstrumented std::vector code (detect_container_overflow=0),
# and leaks are reported only for what our code allocates (suppressions in
# tests/fuzz/lsan.supp for the libraries' process-lifetime singletons).
option(SPIKEGUARD_SANITIZE
  "clang build with ASan+UBSan, -Werror=thread-safety and libFuzzer targets" OFF)

if(NOT SPIKEGUARD_SANITIZE)
  return()
endif()

if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "SPIKEGUARD_SANITIZE=ON needs clang++ (got ${CMAKE_CXX_COMPILER_ID}): "
    "configure with -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
endif()

# Build type "Sanitize" (the Makefile's): -O2, since at -O1 clang leaves the
# standard algorithms un-inlined and the detector tests run 60x slower than
# with g++ (-O2 under ASan: a few times slower); line tables for the reports;
# assert() on (no -DNDEBUG).
set(CMAKE_C_FLAGS_SANITIZE "-O2 -gline-tables-only")
set(CMAKE_CXX_FLAGS_SANITIZE "-O2 -gline-tables-only")
set(CMAKE_EXE_LINKER_FLAGS_SANITIZE "")
set(CMAKE_SHARED_LINKER_FLAGS_SANITIZE "")

set(SPIKEGUARD_SANITIZE_FLAGS
  -fsanitize=address,undefined
  -fno-sanitize-recover=undefined
  -fno-omit-frame-pointer)
add_compile_options(${SPIKEGUARD_SANITIZE_FLAGS} -fsanitize=fuzzer-no-link)
add_link_options(${SPIKEGUARD_SANITIZE_FLAGS})
# The analysis runs on every translation unit, generated code included, and
# its findings are errors everywhere; clang's other warnings are errors in
# our own sources only (SPIKEGUARD_WERROR, as with g++).
add_compile_options(-Wthread-safety -Werror=thread-safety)

# The fuzz targets (tests/fuzz) are built only here.
set(SPIKEGUARD_FUZZ ON)
set(SPIKEGUARD_FUZZ_SECONDS 5 CACHE STRING "seconds each fuzz target runs under ctest")
