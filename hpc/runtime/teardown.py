"""Leaving a process group together: every rank reaches the exit before any rank tears down.

    with hpc.ddp.session() as s:   # on a normal exit, session() calls rendezvous_exit first
        ...

A rank that destroys its gloo group while a peer still has a send or a collective in flight on
it makes that peer abort at process exit ("terminate called without an active exception"):
under `srun --kill-on-bad-exit` a job that trained to the end then ends FAILED, and every
`afterok` stage after it never starts. So on a normal exit each rank first checks in at the
group's rendezvous store, and tears down only once all have.

The check-in goes through the TCP store, not through a collective, for three reasons:
- it is bounded by its own short timeout, independent of the group's (which may be an hour);
- a peer that left by an exception (and never checks in) costs the others that bound, not a hang;
- it costs two store requests per rank, whatever the world size, and no device synchronisation.
"""

from __future__ import annotations

import datetime
import logging

log = logging.getLogger(__name__)

# A peer that never checks in (it left by an exception) delays the others' exit by at most this;
# past it they tear down all the same, which is safe once the slow peer is only writing files.
EXIT_TIMEOUT_S = 60.0


def rendezvous_exit(store, rank: int, world_size: int, generation: int,
                    timeout_s: float = EXIT_TIMEOUT_S) -> bool:
    """Wait until every rank of the group reached its normal exit; True when all did.

    The store's host (rank 0's process for a TCP store) also waits until every rank has seen
    the release, so it does not take the store down under a peer still waiting on it.
    `generation` tells apart the sessions one process opens in turn (every rank counts alike).
    Any failure (a peer gone, the store's host gone, the timeout) is logged and answered False:
    the caller tears down all the same.
    """
    key = f"hpc/exit/{generation}"
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        if store.add(f"{key}/arrived", 1) == world_size:
            store.set(f"{key}/all-arrived", b"1")
        store.wait([f"{key}/all-arrived"], timeout)
        if store.add(f"{key}/released", 1) == world_size:
            store.set(f"{key}/all-released", b"1")
        if rank == 0:
            store.wait([f"{key}/all-released"], timeout)
        return True
    except Exception as exc:  # noqa: BLE001 - teardown goes on whatever the store says
        log.warning("rank %d: not every rank reached the exit within %g s (%s); tearing down anyway",
                    rank, timeout_s, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return False
