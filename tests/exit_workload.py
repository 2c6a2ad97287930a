"""A TrainLoop run to its normal end, for the clean-exit campaign (faults.exits).

    python tests/exit_workload.py OUT --strategy fsdp --steps 3    # in every task of a group

The tiny Net of fsdp_workload trains under TrainLoop with a checkpoint every step: under FSDP they
go through the DCP engine and its second (gloo) group, the configuration whose exits once aborted
("terminate called without an active exception") when a peer tore its groups down. Every rank
writes OUT/rank-<r>.json after the session has ended, so a result file means a whole exit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fsdp_workload import build, data, train_step

import hpc.ddp
from hpc.trainloop import TrainLoop


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="fsdp")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    with hpc.ddp.session(timeout_s=60) as s:
        model, opt = build(s, a.strategy)
        x, y = data(a.steps)
        with TrainLoop(s, a.out, save_every=1, tensorboard=False, watchdog_s=0) as loop:
            loop.resume({"model": model, "optimizer": opt})
            for step in loop.steps(a.steps):
                train_step(s, model, opt, x, y, step)
        rank, last = s.rank, loop.step
    (a.out / f"rank-{rank}.json").write_text(json.dumps({"step": last, "strategy": a.strategy}))


if __name__ == "__main__":
    main()
