"""spikeguard: the Python client of the spikeguard daemon (worker side)."""
