"""Per-step costs that hpc adds, at 2 and 8 gloo ranks: every collective and host call a training
step of TrainLoop makes besides the user's own work, each timed alone.

    python -m bench --only per-step
    RANK=0 ... python -m bench.per_step --out DIR       # one rank (torchrun-style env)

Each launch starts WORLD local processes (bench.ranks); in them, one operation at a time is
called CALLS times in a row after a barrier, and rank 0 reports the time per call, the median of
ROUNDS such runs. The device-sync column is read from the code (see hpc.recovery.stopsignal, hpc.ddp,
hpc.runtime.scalars): on CUDA none of them makes the host wait for the step's kernels.
"""
from __future__ import annotations

import argparse
import time
from statistics import median
from typing import Callable, Dict, List

from bench.common import Context, emit
from bench.ranks import repeated_note, run_ranks
from bench.report import Section

TITLE = "Per-step costs hpc adds (gloo, 2 and 8 ranks)"
TARGET = "each per-step collective and host call listed with its cost; none a blocking device-to-host sync"
WORLDS = (2, 8)
CALLS, ROUNDS = 200, 5
# name -> (what it is, collective per step, device-to-host sync in the step)
OPS = {
    "stop vote": ("TrainLoop's StopVote.poll, about every 0.1 s of training (check_every=N: every N "
                  "steps): launches an 8-byte MAX all-reduce (stop reason, time per step), reads the "
                  "one launched a poll earlier", "1 all-reduce per check, asynchronous",
                  "no drain: on CUDA the result is read from pinned memory behind an event recorded a "
                  "poll earlier, so the host waits only if it runs a whole check ahead of the GPU"),
    "loss averaging": ("s.all_reduce_mean(loss) of a 1-element tensor (one copy, one all-reduce)",
                       "1 all-reduce, if the step calls it", "none: the result stays a tensor (stream-ordered on NCCL)"),
    "bare all_reduce": ("dist.all_reduce of a 1-element tensor, what a hand-written loop calls instead",
                        "1 all-reduce", "none"),
    "loop.log": ("TrainLoop.log('loss', tensor) with TensorBoard on: rank 0 writes, the others return",
                 "none", "none: device values are copied behind an event (hpc.runtime.scalars)"),
    "progress": ("one iteration of s.progress(...) (tqdm on rank 0)", "none", "none"),
    "watchdog beat": ("TrainLoop's watchdog.beat(step) after each step", "none", "none"),
}


def _per_call(fn: Callable[[int], None], barrier: Callable[[], None], after: Callable[[], None]) -> float:
    times = []
    for _ in range(ROUNDS):
        barrier()
        t0 = time.perf_counter()
        for i in range(CALLS):
            fn(i)
        after()
        times.append((time.perf_counter() - t0) / CALLS)
    return median(times)


def child(out: str) -> Dict[str, float]:
    import io

    import torch
    import torch.distributed as dist

    import hpc.ddp
    from hpc.trainloop import TrainLoop

    with hpc.ddp.session(timeout_s=300) as s:
        model = s.wrap(torch.nn.Linear(4, 4))
        with TrainLoop(s, out, save_every=10**9, watchdog_s=600) as loop:
            loop.resume({"model": model})
            loss, nothing = torch.tensor(0.5), (lambda: None)
            bar = s.progress(range(10**9), file=io.StringIO())
            it = iter(bar)
            ops = {"stop vote": (lambda i: loop.vote.poll(), loop.vote.close),
                   "loss averaging": (lambda i: s.all_reduce_mean(loss), nothing),
                   "bare all_reduce": (lambda i: dist.all_reduce(loss.clone()), nothing),
                   "loop.log": (lambda i: loop.log("loss", loss, step=i + 1), nothing),
                   "progress": (lambda i: next(it), nothing),
                   "watchdog beat": ((lambda i: loop.watchdog.beat(i)) if loop.watchdog else (lambda i: None), nothing)}
            result = {name: _per_call(fn, s.barrier, after) for name, (fn, after) in ops.items()}
            loop.watchdog.rest() if loop.watchdog else None
        s.barrier()
    return result


def fmt_us(x: float) -> str:
    return f"{x * 1e6:.1f} us" if x < 1e-3 else f"{x * 1e3:.2f} ms"


def run(ctx: Context) -> Section:
    sec = Section("per-step", TITLE, TARGET,
                  "python -m bench --only per-step" + (" --quick" if ctx.quick else ""),
                  headers=["per step", "what", *[f"{w} ranks" for w in WORLDS], "collective", "device-to-host sync"])
    repeated: List[str] = []
    by_world = {}
    for w in WORLDS:
        out = ctx.scratch(f"per-step-{w}")
        by_world[w] = run_ranks("per_step", ["--out", str(out)], out, f"per-step, {w} ranks", repeated, world=w)
    for name, (what, collective, sync) in OPS.items():
        sec.rows.append([name, what, *[fmt_us(by_world[w][name]) for w in WORLDS], collective, sync])
    sec.notes += [
        f"time per call: {CALLS} calls in a row after a barrier, median of {ROUNDS} runs, rank 0; local "
        "processes with one thread each, gloo over 127.0.0.1, on this machine's 2 cores: at 8 ranks "
        "the processes share the cores, so collectives there also measure the scheduler",
        "a collective's cost on CPU/gloo is mostly the round trip between the ranks; on GPUs with NCCL "
        "the vote and the loss all-reduce are queued on the stream and overlap the step",
        "not per step: the periodic checkpoint (see the checkpoint sections) and, once, the barrier after "
        "the first step (training_started)"] + repeated_note(repeated)
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.per_step")
    p.add_argument("--out", required=True, help="TrainLoop's directory")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    emit(child(a.out))


if __name__ == "__main__":
    main()
