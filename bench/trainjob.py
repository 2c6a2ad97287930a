"""The training job that bench.preempt_safe and bench.resume run as a child process.

    python -m bench.trainjob --out DIR --size-mb 100 --mode first-step   # exits after step 1
    python -m bench.trainjob --out DIR --size-mb 100 --mode preempt      # trains until SIGTERM
    python -m bench.trainjob --out DIR --size-mb 100 --mode save         # 2 steps, final checkpoint
    srun python -m bench.trainjob --out DIR --size-mb 100 --mode preempt --report F  # under SLURM

A single-process hpc.ddp session and hpc.trainloop.TrainLoop around a model of `size-mb` of
parameters (SGD, so the optimiser adds no state). The last stdout line is JSON with wall-clock
timestamps (time.time(), comparable with the parent's on the same machine). Under SLURM a stop
ends in a requeue (SystemExit), not in JobNotRequeued: --report names a file that gets the same
JSON either way, and a file `ready` is written beside it when training has started.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench.common import emit

T_PROCESS = time.time()  # as early as this module can take it; the parent records the launch too


def build(size_mb: int):
    import torch

    n = size_mb * 2**20 // 4
    chunk = 16 * 2**20  # 64 MB per parameter, like the layers of a model
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(min(chunk, n - i)))
                                    for i in range(0, n, chunk)])
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def train_step(model, opt, step: int) -> None:
    """The compute of a step, then an SGD update that changes every parameter tensor in place.

    The gradient covers a strided slice of each tensor, not all of it: a dense update of the
    whole state is slow on a CPU where a GPU does it at once, and the preemption benchmark would
    then time that step instead of the stop. Its duration is reported beside the results.
    """
    import torch

    x = torch.randn(256, 256)
    (x @ x).tanh().sum()
    with torch.no_grad():
        for p in model:
            p[step % 1024::4096].add_(-1e-3)
    opt.zero_grad(set_to_none=True)
    opt.step()  # no gradients: keeps the optimizer's place in the loop at no cost


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.trainjob")
    p.add_argument("--out", required=True)
    p.add_argument("--size-mb", type=int, required=True)
    p.add_argument("--mode", choices=["first-step", "preempt", "save"], required=True)
    p.add_argument("--report", help="also write the stop's JSON to this file (see module docstring)")
    a = p.parse_args()
    import torch

    import hpc.ddp
    from hpc.recovery.preemption import JobNotRequeued
    from hpc.trainloop import TrainLoop

    torch.set_num_threads(1)
    with hpc.ddp.session() as s:
        model, opt = build(a.size_mb)
        loop = TrainLoop(s, Path(a.out), save_every=10**9, tensorboard=False)
        resumed = loop.resume({"model": model, "optimizer": opt})
        total = {"first-step": resumed + 1, "save": resumed + 2, "preempt": 10**9}[a.mode]
        try:
            for step in loop.steps(total):
                if step == resumed + 1:
                    t_first = time.time()
                    if a.mode == "preempt":
                        print("READY", flush=True)  # the parent sends SIGTERM after this
                        if a.report:
                            Path(a.report).with_name("ready").write_text(str(os.getpid()))
                train_step(model, opt, step)
                t_step_end = time.time()
        except (JobNotRequeued, SystemExit) as err:  # the checkpoint is durable and the stop decided
            stop = {"t_process": T_PROCESS, "t_first_step": t_first, "t_safe": time.time(),
                    "t_signal_seen": loop.flag.received_at, "t_step_end": t_step_end,
                    "step_s": (t_step_end - t_first) / max(1, loop.step - resumed),
                    "step": loop.step, "requeued": isinstance(err, SystemExit),
                    "why": "exited for requeue" if isinstance(err, SystemExit) else str(err)}
            if a.report:
                Path(a.report).write_text(json.dumps(stop))
            emit(stop)
            if isinstance(err, SystemExit):
                raise
            return
        if a.mode == "save":
            loop.finish()
        emit({"t_process": T_PROCESS, "t_first_step": t_first, "resumed": resumed, "step": loop.step})
    if a.mode == "first-step":
        sys.stdout.flush()
        os._exit(0)  # leave without a final checkpoint: the next run resumes from the same one


if __name__ == "__main__":
    main()
