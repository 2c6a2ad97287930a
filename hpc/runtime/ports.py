"""A TCP port free on this host, for a rendezvous or a socket that a process binds a moment later.

Asking the kernel for port 0 returns one of Linux's ephemeral ports (32768-60999), the same range
every outgoing connection draws from: between the probe and the bind, a connection of another
process (a gloo peer, an RPC) can take it, and the rendezvous fails with EADDRINUSE. Ports here are
drawn from just below that range and above the job ports hpc derives from SLURM_JOB_ID
(hpc.runtime.distenv: 20000-31999), so only another explicit bind can race for them. Concurrent callers
that know their index (a pytest-xdist worker, an array task) pass `slot` and `slots` and draw from
disjoint slices.
"""
from __future__ import annotations

import random
import socket

PORTS = range(32000, 32768)


def free_port(slot: int = 0, slots: int = 1, host: str = "127.0.0.1") -> int:
    """A port of PORTS (slice `slot` of `slots`) that nothing on `host` listens on or holds now."""
    if not 0 <= slot < slots:
        raise ValueError(f"slot={slot} of slots={slots}; expected 0 <= slot < slots")
    candidates = list(PORTS[slot::slots])
    random.SystemRandom().shuffle(candidates)
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind((host, port))  # no SO_REUSEADDR: a port in TIME_WAIT counts as taken
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1} (slice {slot} of {slots}) on {host}. "
                       "HINT: close processes that listen there, or set MASTER_PORT yourself")
