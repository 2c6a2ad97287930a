"""Hang workloads: a rank that stops itself mid-training, and a collective past the training timeout.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. python tests/hang_workload.py stall OUT '{"watchdog_s": 2, ...}'

`stall` trains a small DDP model through TrainLoop with a watchdog; in the first attempt (restart 0)
rank cfg["stop_rank"] hangs inside step cfg["stop_at"] (once a checkpoint is committed): it sends
itself SIGSTOP (cfg["how"] "stop", the default) or sleeps for good ("sleep"). Each rank records where it runs (where-R.json). `timeout` switches to the training collective
timeout, then rank 0 waits in an all-reduce that rank 1 never joins and writes what happened.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def stall(out: str | Path, cfg: dict) -> dict:
    import torch

    from hpc import ddp
    from hpc.trainloop import TrainLoop

    out = Path(out)
    with ddp.session(timeout_s=cfg.get("timeout_s", 120), train_timeout_s=cfg.get("train_timeout_s")) as s:
        if s.env.restart_count == 0:
            (out / f"where-{s.rank}.json").write_text(json.dumps(
                {"rank": s.rank, "host": os.environ.get("SLURMD_NODENAME", ""), "pid": os.getpid()}))
        torch.manual_seed(0)
        model = s.wrap(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with TrainLoop(s, out, save_every=cfg.get("save_every", 2), tensorboard=False,
                       watchdog_s=cfg["watchdog_s"]) as loop:
            start = loop.resume({"model": model, "optimizer": opt})
            for step in loop.steps(cfg["steps"]):
                loss = model(torch.full((8, 4), float(step))).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if s.rank == cfg["stop_rank"] and step == cfg["stop_at"] and s.env.restart_count == 0:
                    while loop.store.latest() is None:  # a checkpoint to resume from, then the hang
                        time.sleep(0.05)
                    if cfg.get("how", "stop") == "stop":
                        os.kill(os.getpid(), signal.SIGSTOP)
                    else:
                        while True:  # alive, in Python, but never done with its step
                            time.sleep(1)
                time.sleep(cfg.get("step_s", 0.05))
        return {"rank": s.rank, "step": loop.step, "resumed_from": start, "world_size": s.world_size}


def timeout(out: str | Path, cfg: dict) -> None:
    import torch
    import torch.distributed as dist

    from hpc import ddp

    out = Path(out)
    with ddp.session(timeout_s=cfg["timeout_s"], train_timeout_s=cfg.get("train_timeout_s")) as s:
        s.training_started()
        if s.rank == 0:
            started, outcome = time.monotonic(), "completed"
            try:
                dist.all_reduce(torch.ones(1))
            except RuntimeError:
                outcome = "raised"
            (out / "outcome.json").write_text(json.dumps({"outcome": outcome,
                                                          "waited_s": time.monotonic() - started}))
        else:  # never joins: waits until rank 0 has said what happened to its all-reduce
            while not (out / "outcome.json").exists():
                time.sleep(0.05)
        os._exit(0)  # the group is broken: no teardown


def launch(kind: str, world: int, out: Path, cfg: dict) -> list:
    """`world` processes of `kind` on this machine, with the variables torchrun sets."""
    import subprocess

    import ranklaunch
    from test_ddp_session import free_port

    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {"PATH": os.environ["PATH"], "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "OMP_NUM_THREADS": "1", "HPC_WATCHDOG_S": ""}
        procs.append(ranklaunch.popen([sys.executable, __file__, kind, str(out), json.dumps(cfg)],
                                      env=env, stderr=subprocess.PIPE, text=True))
    return procs


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    {"stall": stall, "timeout": timeout}[sys.argv[1]](sys.argv[2], json.loads(sys.argv[3]))
