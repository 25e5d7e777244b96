#!/usr/bin/env bash
# Installs spikeguard's build and test dependencies from Debian's packages.
# Idempotent: when every package is already installed, no apt call is made.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  # A compiler cache: a clean clone on the same machine reuses earlier objects
  ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libsqlite3-dev sqlite3 libgtest-dev libgmock-dev
  libbenchmark-dev libopenblas-dev libssl-dev openssl
  python3 python3-dev python3-pytest python3-numpy python3-protobuf python3-grpcio
  python3-torch python3-pybind11 pybind11-dev
  # pip install ./worker/python into a venv (tests/python/test_pip_install.py)
  python3-venv python3-pip python3-setuptools python3-wheel
  # make check-sanitize / make fuzz: clang++, its sanitizer and libFuzzer
  # runtimes (only recommended by clang, hence named), llvm-symbolizer
  clang libclang-rt-14-dev llvm
  # The Slurm launcher's tests start a single-node Slurm (tests/slurm)
  slurm-wlm slurm-client munge
  # The daemon's web view and /metrics (daemon/http), and the headless browser
  # its tests load the pages in (tests/http)
  libcpp-httplib-dev chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
