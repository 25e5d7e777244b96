"""pip install ./worker/python: the spikeguard package (the worker side:
client, telemetry, Supervisor, data plans, checkpoints) into any Python
environment, built offline from Debian's packages.

    python3 -m venv --system-site-packages venv   # Debian's torch, grpcio, protobuf
    venv/bin/pip install ./worker/python

What the build makes, as the CMake build does for ${build}/python:
- spikeguard/v1/*_pb2.py, *_pb2_grpc.py: the wire contract's stubs, generated
  from proto/spikeguard/v1 with protoc and grpc_python_plugin
  (protobuf-compiler-grpc);
- spikeguard._corpus: the pybind11 binding of storage/corpus (pybind11-dev,
  libabsl-dev), compiled from the same sources as the CMake targets
  spikeguard_corpus, spikeguard_checksum and spikeguard_base: their source
  lists are read from those targets' CMakeLists.txt, so a file added there is
  compiled here too.

No pyproject.toml on purpose: pip then builds with the environment's own
setuptools and pybind11 (a venv with --system-site-packages sees Debian's)
instead of fetching them into an isolated build environment, which needs a
network.
"""
import os
import pathlib
import re
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
PROTOS = ["telemetry", "policy", "worker", "supervisor"]
# The libraries the binding compiles, with the CMakeLists.txt that lists their sources.
LIBRARIES = [("storage/corpus", "spikeguard_corpus"),
             ("storage/checkpoint", "spikeguard_checksum"),
             ("base", "spikeguard_base")]
# Abseil's pkg-config modules for what those targets link (target_link_libraries).
ABSL = ["absl_status", "absl_statusor", "absl_strings", "absl_str_format", "absl_time",
        "absl_synchronization", "absl_span"]


def library_sources(folder: str, target: str) -> list:
    """The sources of `add_library(target STATIC ...)` in folder/CMakeLists.txt."""
    text = (REPO / folder / "CMakeLists.txt").read_text()
    m = re.search(r"add_library\(\s*" + re.escape(target) + r"\s+STATIC\s+([^)]*)\)", text)
    if not m:
        raise RuntimeError(f"{folder}/CMakeLists.txt: no add_library({target} STATIC ...)")
    names = m.group(1).split()
    if not names or not all(n.endswith(".cc") for n in names):
        raise RuntimeError(f"{folder}/CMakeLists.txt: unexpected sources of {target}: {names}")
    # Absolute: setuptools then puts their objects under its build folder
    # (a relative ../../ path would put them beside this file).
    return [str(REPO / folder / n) for n in names]


def pkg_config(*args) -> list:
    try:
        out = subprocess.run(["pkg-config", *args, *ABSL], check=True, capture_output=True,
                             text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError("spikeguard: Abseil's pkg-config files are missing "
                           f"(Debian: libabsl-dev, pkg-config): {e}") from e
    return shlex.split(out)


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"spikeguard: {name} not found (Debian: {package})")
    return path


class BuildPyWithStubs(build_py):
    """The package's sources, then the stubs generated into the same tree."""

    def run(self):
        super().run()
        out = pathlib.Path(self.build_lib).resolve()
        (out / "spikeguard" / "v1").mkdir(parents=True, exist_ok=True)
        proto_root = REPO / "proto"
        files = [str(proto_root / "spikeguard" / "v1" / f"{p}.proto") for p in PROTOS]
        subprocess.run(
            [tool("protoc", "protobuf-compiler"), f"--proto_path={proto_root}",
             f"--python_out={out}", f"--grpc_python_out={out}",
             "--plugin=protoc-gen-grpc_python="
             + tool("grpc_python_plugin", "protobuf-compiler-grpc"), *files],
            check=True, cwd=proto_root)
        (out / "spikeguard" / "v1" / "__init__.py").touch()


ParallelCompile("SPIKEGUARD_BUILD_JOBS", default=os.cpu_count() or 1).install()

sources = [str(HERE / "binding" / "corpus_module.cc")]
for folder, target in LIBRARIES:
    sources += library_sources(folder, target)

# Headers too: setuptools rebuilds the module only when one of these is
# newer than it (pip builds in the source tree and keeps build/ between installs).
headers = [str(h) for folder, _ in LIBRARIES for h in sorted((REPO / folder).glob("*.h"))]

corpus = Pybind11Extension(
    "spikeguard._corpus",
    sorted(sources),
    depends=headers,
    include_dirs=[str(REPO)],
    cxx_std=20,
    extra_compile_args=pkg_config("--cflags") + ["-O2", "-pthread"],
    extra_link_args=pkg_config("--libs") + ["-pthread"],
)

setup(
    name="spikeguard",
    version=re.search(r"project\(spikeguard VERSION ([0-9.]+)",
                      (REPO / "CMakeLists.txt").read_text()).group(1),
    description="The worker side of spikeguard: client, telemetry, Supervisor, data plans, "
                "checkpoints",
    packages=["spikeguard"],
    package_dir={"spikeguard": "spikeguard"},
    python_requires=">=3.9",
    # Debian's python3-grpcio, python3-protobuf and python3-numpy; torch
    # (python3-torch) only for spikeguard.torch and spikeguard.supervise.
    install_requires=["grpcio", "protobuf", "numpy"],
    ext_modules=[corpus],
    cmdclass={"build_py": BuildPyWithStubs, "build_ext": build_ext},
    zip_safe=False,
)
