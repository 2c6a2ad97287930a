"""Workloads the DDP tests run in every task, locally or under srun.

    srun -N2 --ntasks-per-node=2 python tests/ddp_workload.py allreduce OUT_DIR
    python tests/ddp_workload.py train OUT_DIR --global-batch 16 --per-device-max 4

Each task writes OUT_DIR/rank-<r>.json (and rank 0 the trained weights) so the test can
check what every rank saw.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

import hpc.ddp


def allreduce(s, args):
    total = s.all_reduce_sum(float(s.rank + 1))
    mean = s.all_reduce_mean(torch.tensor([float(s.rank), 1.0]))
    s.barrier()
    return {"sum": total, "mean": mean.tolist()}


def train(s, args):
    """A tiny regression; each optimizer step sees the same global batch at any world size."""
    plan = s.plan_batch(args.global_batch, args.per_device_max)
    gen = torch.Generator().manual_seed(1)
    n = args.global_batch * args.steps
    x = torch.randn(n, 8, generator=gen, dtype=torch.float64)
    y = x @ torch.randn(8, 1, generator=gen, dtype=torch.float64) + 0.1
    torch.manual_seed(0)
    model = s.wrap(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1)).double())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    share = args.global_batch // s.world_size
    for step in range(args.steps):
        rows = torch.arange(step * args.global_batch, (step + 1) * args.global_batch)
        mine = rows[s.rank * share:(s.rank + 1) * share]
        for micro in range(plan.accum_steps):
            idx = mine[micro * plan.micro_batch:(micro + 1) * plan.micro_batch]
            with s.no_sync_if(not plan.sync_step(micro)):
                loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx]) / plan.accum_steps
                loss.backward()
        opt.step()
        opt.zero_grad()
    if s.is_main:
        weights = getattr(model, "module", model).state_dict()
        torch.save(weights, Path(args.out) / "weights.pt")
    return {"micro_batch": plan.micro_batch, "accum_steps": plan.accum_steps}


def fail(s, args):
    """Rank 1 raises; the others block in a collective until the session's timeout or error. A
    barrier first: a rank that raised before every rank had finished setting up would fail the others
    in their set-up, not in a collective."""
    started = time.monotonic()
    try:
        s.barrier()
        if s.rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        s.all_reduce_sum(1.0)
    finally:
        if s.rank != 1:
            Path(args.out, f"rank-{s.rank}.elapsed").write_text(f"{time.monotonic() - started:.2f}")
    return {}


def hang(s, args):
    """Rank 1 stays alive but never joins: only the session timeout can end the others."""
    if s.rank == 1:
        time.sleep(args.timeout * 10)
    return fail(s, args)


def leave(s, args):
    """A normal exit where the last rank is slow to leave: at its teardown each rank records which
    peers had already finished their work (a file each writes as its very last act in the body)."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group

    def recording_destroy(*a, **kw):
        done = sorted(int(p.stem.split("-")[1]) for p in Path(args.out).glob("left-*"))
        Path(args.out, f"teardown-{s.rank}.json").write_text(json.dumps(done))
        return destroy(*a, **kw)

    dist.destroy_process_group = recording_destroy
    s.all_reduce_sum(1.0)
    if s.rank == s.world_size - 1:
        time.sleep(1.0)  # still busy when the others have finished
    return {}


def stop_trial(trial: int, world: int) -> dict:
    """Which rank gets the signal, when, and how often the ranks vote: varied across trials.

    Every third trial the signal comes from a timer thread at an arbitrary moment (inside a
    step, a vote or a collective); the others raise it inside the body of a given step. With
    check_every None the checks are paced by the ranks' step times, which differ by rank."""
    return {"rank": trial % world, "check_every": (1, 2, 3, None)[(trial // world) % 4],
            "step": 1 + (trial * 7) % 11, "timer_s": 0.002 * (trial % 13) if trial % 3 == 2 else None}


def stop(s, args):
    """Trials of TrainLoop's agreed stop: only one rank is signalled; each rank records its stop."""
    import signal
    import threading

    from hpc.recovery.preemption import JobNotRequeued
    from hpc.trainloop import TrainLoop

    stops = []
    for trial in range(args.steps):
        plan = stop_trial(trial, s.world_size)
        mine = plan["rank"] == s.rank
        loop = TrainLoop(s, Path(args.out) / f"trial-{trial}", save_every=10**9,
                         check_every=plan["check_every"], tensorboard=False)
        if mine and plan["timer_s"] is not None:
            threading.Timer(plan["timer_s"], os.kill, (os.getpid(), signal.SIGUSR2)).start()
        polls, poll = [], loop.vote.poll

        def recorded(pace=0, loop=loop, poll=poll, polls=polls):  # each poll's step, sent and agreed pace
            request = poll(pace)
            polls.append([loop.step, pace, loop.vote.agreed_pace])
            return request
        loop.vote.poll = recorded
        try:
            with loop:
                loop.resume({})
                for step in loop.steps(10**6):
                    s.all_reduce_sum(1.0)  # a blocking collective between the votes in flight
                    if mine and plan["timer_s"] is None and step == plan["step"]:
                        os.kill(os.getpid(), signal.SIGUSR2)
                    time.sleep(0.001 * (1 + s.rank))  # the slowest rank sets the pace of the checks
        except JobNotRequeued:
            stops.append({"step": loop.step, "saw_signal": loop.flag.reason is not None,
                          "polls": polls})
    return {"stops": stops}


def lagging(s, args):
    """A gloo worker that torch has not scheduled since its collective ended, still running as the
    session ends: here a thread under the workers' name that computes for args.lag_s without the GIL.
    After the session, each rank records whether it had finished (hpc.ddp.settle_workers)."""
    import ctypes
    import hashlib
    import threading

    done = threading.Event()

    def work() -> None:
        ctypes.CDLL(None).prctl(15, hpc.ddp.GLOO_WORKER.encode(), 0, 0, 0)  # PR_SET_NAME: this thread
        data, until = bytes(2**22), time.monotonic() + args.lag_s
        while time.monotonic() < until:
            hashlib.sha256(data).digest()  # without the GIL: the thread runs, as a late worker does
        done.set()

    threading.Thread(target=work, daemon=True).start()
    s.barrier()
    AFTER_SESSION.append(lambda: {"worker_done": done.is_set()})
    return {}


WORKLOADS = {"allreduce": allreduce, "train": train, "fail": fail, "hang": hang, "stop": stop,
             "leave": leave, "lagging": lagging}
AFTER_SESSION: list = []  # what a workload records once the session has ended: after-<rank>.json


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("out")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--per-device-max", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--lag-s", type=float, default=1.0)
    args = parser.parse_args()
    with hpc.ddp.session(timeout_s=args.timeout) as s:
        result = WORKLOADS[args.workload](s, args)
        result.update(rank=s.rank, local_rank=s.local_rank, world_size=s.world_size,
                      device=str(s.device), host=os.environ.get("SLURMD_NODENAME", ""),
                      source=s.env.source, master=f"{s.env.master_addr}:{s.env.master_port}")
        Path(args.out, f"rank-{s.rank}.json").write_text(json.dumps(result))
        Path(args.out, f"left-{s.rank}").touch()  # the last act inside the session
    for after in AFTER_SESSION:
        Path(args.out, f"after-{s.rank}.json").write_text(json.dumps(after()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
