"""A one-stage pipeline training tests/elastic_workload.py's model through TrainLoop, with a fault injected
mid-training: the tests of restarts in place (tests/slurm/test_restart_in_place.py).

    hpc.pipeline.plan.PIPELINES["inplace"] = "tests.inplace_pipeline"; python -m hpc.submit inplace ...

inplace.fault: 'kill' (rank fault_rank SIGKILLs itself before step fault_at), 'hang' (it SIGSTOPs
itself there: the others wait in the step's collective until their watchdog fires), or 'none'. It
fails in the first `fault_steps` srun steps of the job's first allocation (2: the restart fails
too), never after a requeue; with fault_every, each later step fails that many steps further on,
and 'kill-hang' takes turns (faults/inplace.py's repeated failures). inplace.hold_at=K makes every
rank of the first step wait before step K until the file inplace.release exists (a test fails a node
meanwhile). Every step of the job logs apart, under a tag of its job id, restart count and restart
in place, as tests/elastic_pipeline.py's attempts do (attempts.jsonl: each step's first training
step, with its time); each rank writes its pid and node to pid-<tag><rank>.json, and the failing
rank the fault's time and kind to fault-<tag>.json.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List

from hpc.config.schema import PipelineConfig
from hpc.pipeline.plan import PipelineDef, StageDef
from tests.elastic_pipeline import BATCH, TrainOn2x2


@dataclass
class InPlaceSection:
    steps: int = 8
    save_every: int = 1
    fault: str = "none"  # kill | hang | none; kill-hang: the steps of the job take turns
    fault_at: int = 4
    fault_rank: int = 1
    fault_steps: int = 1  # srun steps of the first allocation that fail
    fault_every: int = 0  # srun step K of the allocation fails before step fault_at + K x fault_every
    hold_at: int = 0  # 0: no hold
    release: str = ""  # the file that ends the hold
    watchdog_s: float = 3.0


@dataclass
class InPlaceConfig(PipelineConfig):
    stages: TrainOn2x2 = field(default_factory=TrainOn2x2)  # the tests ask for 1 node x 2 tasks
    inplace: InPlaceSection = field(default_factory=InPlaceSection)


def stages(cfg: Any) -> List[StageDef]:
    return [StageDef("train", "tests.inplace_pipeline:train", batch=BATCH)]


def train(ctx: Any) -> dict:
    cfg = ctx.cfg["inplace"]
    sys.path.insert(0, str(Path(__file__).parent))  # elastic_workload imports its neighbours by name
    import elastic_workload
    import torch

    import hpc.ddp

    torch.set_num_threads(1)
    step_in_job = int(os.environ.get("HPC_RESTART_IN_PLACE") or 0)
    tag = f"{ctx.env.job_id}-{ctx.env.restart_count}-{step_in_job}-"
    faulty = ctx.env.restart_count == 0 and step_in_job < cfg["fault_steps"] and cfg["fault"] != "none"
    kinds = cfg["fault"].split("-")
    fault, fault_at = kinds[step_in_job % len(kinds)], cfg["fault_at"] + step_in_job * cfg["fault_every"]
    os.environ["HPC_WATCHDOG_S"] = str(cfg["watchdog_s"])  # read when TrainLoop starts its watchdog

    def before_step(loop: Any, step: int) -> None:
        if step == loop.resumed_step + 1:
            (ctx.stage_dir / f"pid-{tag}{loop.s.rank}.json").write_text(
                json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "node": os.environ.get("SLURMD_NODENAME")}))
            if loop.s.is_main:
                with open(ctx.stage_dir / "attempts.jsonl", "a") as f:
                    f.write(json.dumps({"tag": tag, "world_size": loop.s.world_size, "nodes": ctx.env.num_nodes,
                                        "resumed_from": loop.resumed_step, "time": time.time()}) + "\n")
        if step == cfg["hold_at"] and step_in_job == 0 and ctx.env.restart_count == 0:
            deadline = time.monotonic() + 120
            while not Path(cfg["release"]).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if faulty and step == fault_at and loop.s.rank == cfg["fault_rank"]:
            (ctx.stage_dir / f"fault-{tag}.json").write_text(json.dumps({"time": time.time(), "kind": fault}))
            os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)

    with hpc.ddp.session(timeout_s=60, train_timeout_s=30) as s:
        elastic_workload.train(s, ctx.stage_dir, "ddp", cfg["steps"], save_every=cfg["save_every"],
                               tag=tag, before_step=before_step)
        return {"world_size": s.world_size}


PIPELINE = PipelineDef("inplace", InPlaceConfig, stages)
