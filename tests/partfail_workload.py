"""A TrainLoop save in which one rank cannot write its part of the model (disk full).

    python tests/partfail_workload.py fail ROOT     # in every task of a world-2 group

Rank 1's DCP writes raise ENOSPC from the first save on (step 2 of 6, asynchronous). Each rank
records the error that ended its loop, and the steps whose checkpoints are on disk, in
ROOT/fail-RANK.json, then leaves normally so that the test reads every rank's account.
"""

from __future__ import annotations

import errno
from pathlib import Path

import torch

from anyresume_workload import build, step
from fsdp_workload import run_mode
from hpc.trainloop import TrainLoop

FAILS_FROM, STEPS = 2, 6


def fail(s, root: Path) -> dict:
    from torch.distributed.checkpoint import FileSystemWriter

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if s.rank == 1:
        FileSystemWriter.write_data = full
    model, opt = build(s, "fsdp")
    error = None
    try:
        with TrainLoop(s, root / "run", save_every=FAILS_FROM, tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt})
            for n in loop.steps(STEPS):
                step(s, model, opt, n)
    except Exception as err:  # noqa: BLE001 - the account is the point
        error = f"{type(err).__name__}: {err}"
    torch.distributed.barrier()  # both accounts are written while the group still stands
    names = sorted(p.name for p in (root / "run" / "checkpoints").iterdir()) if s.rank == 0 else None
    return {"error": error, "entries": names}


if __name__ == "__main__":
    run_mode({"fail": fail})
