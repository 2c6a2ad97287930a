"""The checkpoint writer lock under the other ranks' probes at a resumed attempt's first save.

    python -m pytest -q tests/test_writer_lock.py
"""

from __future__ import annotations

import multiprocessing as mp
import time

from hpc.checkpoint import writer_lock as wl


def _probe(path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        wl._is_held(wl.Path(path))


def test_rank_0_gets_the_lock_while_other_ranks_probe_it(tmp_path):
    """Ranks > 0 ask whether the lock is held (a shared flock for an instant) while rank 0 takes
    it: the lock file exists from the attempt before, so every resume meets this. A probe must
    never look like a second writer to rank 0."""
    lock_file = tmp_path / wl.LOCK_NAME
    lock_file.write_text("{}")  # left by the previous attempt
    probers = [mp.get_context("fork").Process(target=_probe, args=(str(lock_file), 4.0)) for _ in range(2)]
    for p in probers:
        p.start()
    try:
        for _ in range(300):
            lock = wl.WriterLock(tmp_path, generation="attempt-2")
            lock.acquire()  # raised StoreLocked naming the dead previous attempt, about 1 in 60
            lock.release()
    finally:
        for p in probers:
            p.join()
