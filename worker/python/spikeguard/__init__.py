"""spikeguard: the Python client of the spikeguard daemon (worker side).

    from spikeguard import Client, Rejected, Unauthorized
    from spikeguard.v1 import telemetry_pb2, worker_pb2   # generated at build time
"""

__all__ = ["Client", "Rejected", "Unauthorized"]

# Loaded on first use, so that submodules that do not talk to the daemon do
# not import gRPC.
_LAZY = {
    "Client": "spikeguard.client",
    "Rejected": "spikeguard.client",
    "Unauthorized": "spikeguard.client",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spikeguard' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
