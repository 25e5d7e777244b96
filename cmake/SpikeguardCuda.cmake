# The CUDA kernels (kernels/cuda): whether to build them, and how.
#
#   SPIKEGUARD_CUDA=AUTO  (default) when nvcc is found: on PATH, $CUDACXX, or
#                         /usr/local/cuda/bin/nvcc; otherwise a CPU-only build
#   SPIKEGUARD_CUDA=ON    nvcc is required
#   SPIKEGUARD_CUDA=OFF   CPU only
#
# No GPU is needed to compile. The code is built for one architecture,
# CMAKE_CUDA_ARCHITECTURES (default 90: the H100 and H200), to keep the
# compile short; pass e.g. -DCMAKE_CUDA_ARCHITECTURES=native on a GPU machine.
# The clang sanitizer build leaves CUDA out under AUTO: its -fsanitize flags
# are not nvcc's. Sets SPIKEGUARD_HAVE_CUDA.
include_guard(GLOBAL)

# An older cache holds the former OFF-by-default boolean option; that was
# never a choice, so it becomes AUTO.
get_property(_sg_cuda_type CACHE SPIKEGUARD_CUDA PROPERTY TYPE)
if(_sg_cuda_type STREQUAL "BOOL")
  set(SPIKEGUARD_CUDA AUTO CACHE STRING "Build the CUDA kernels: AUTO (when nvcc is found), ON or OFF" FORCE)
endif()
set(SPIKEGUARD_CUDA AUTO CACHE STRING "Build the CUDA kernels: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE SPIKEGUARD_CUDA PROPERTY STRINGS AUTO ON OFF)

set(SPIKEGUARD_HAVE_CUDA OFF)
string(TOUPPER "${SPIKEGUARD_CUDA}" _sg_cuda)
if(_sg_cuda STREQUAL "AUTO" AND SPIKEGUARD_SANITIZE)
  message(STATUS "spikeguard: CUDA left out of the sanitizer build")
elseif(_sg_cuda STREQUAL "AUTO" OR SPIKEGUARD_CUDA)
  # nvcc need not be on PATH: the toolkit's default folder is searched too.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(SPIKEGUARD_NVCC NAMES nvcc PATHS /usr/local/cuda/bin NO_CACHE)
    if(SPIKEGUARD_NVCC)
      set(ENV{CUDACXX} "${SPIKEGUARD_NVCC}")
    endif()
  endif()
  # A trial project first, so that a missing or broken nvcc (a wrapper left
  # behind by a removed toolkit) means a CPU build rather than a failed
  # configure.
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    if(SPIKEGUARD_CCACHE_PROGRAM AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${SPIKEGUARD_CCACHE_PROGRAM})
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(SPIKEGUARD_HAVE_CUDA ON)
    message(STATUS "spikeguard: CUDA kernels on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
      "architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_sg_cuda STREQUAL "AUTO")
    message(STATUS "spikeguard: no working nvcc found; CPU build only")
  else()
    message(FATAL_ERROR "SPIKEGUARD_CUDA=ON but no working nvcc was found (PATH, CUDACXX, /usr/local/cuda/bin)")
  endif()
endif()
