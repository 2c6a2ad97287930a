"""Rank 0 calls a DCP save with collectives while rank 1 stays away: how long until rank 0 gives up?

    python tests/timeout_workload.py OUT start|train SECONDS     (as each rank of a local group)

start: hpc.ddp.session(timeout_s=SECONDS), the engine made right away. train: the session starts
with a long timeout_s and train_timeout_s=SECONDS; the engine is made before training_started(),
and the save comes after it. Rank 0 writes OUT/rank-0.json with the error and the seconds it
waited; rank 1 waits for that file. Both leave with os._exit: a group that timed out cannot be
torn down in order.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import hpc.ddp
from hpc.checkpoint.dcp_engine import DcpEngine


def main() -> None:
    out, mode, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    report = out / "rank-0.json"
    timeouts = {"timeout_s": seconds} if mode == "start" else {"timeout_s": 120, "train_timeout_s": seconds}
    # Both ranks have imported torch before either starts the session: on a loaded machine one may
    # import for longer than the SECONDS the rendezvous itself is given in `start` mode.
    rank = os.environ["RANK"]
    (out / f"imported-{rank}").touch()
    deadline = time.monotonic() + 120
    while len(list(out.glob("imported-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with hpc.ddp.session(**timeouts) as s:
        engine = DcpEngine(s)
        s.training_started()
        if s.rank != 0:
            deadline = time.monotonic() + 120
            while not report.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            os._exit(0)
        t0 = time.monotonic()
        try:
            engine.save(out / "ckpt", torch.nn.Linear(2, 2), blocking=True)
            error = None
        except BaseException as e:  # DCP wraps failures in a BaseException
            error = f"{type(e).__name__}: {e}"
        tmp = report.with_suffix(".tmp")
        tmp.write_text(json.dumps({"error": error, "waited": time.monotonic() - t0}))
        tmp.rename(report)
        os._exit(0)


if __name__ == "__main__":
    main()
