"""Launch a benchmark's ranks: WORLD local processes of one torchrun-style group (gloo over
127.0.0.1, one torch thread each), and rank 0's result.

    result = run_ranks("ddp_overhead", ["--pair", "session", "--out", d], Path(d), "DDP", repeated)
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence, TypeVar

from bench.common import REPO, child_env, free_port

WORLD = 2
T = TypeVar("T")


def start_ranks(module: str, args: List[str], world: int = WORLD,
                rank0_prefix: Sequence[str] = ()) -> List[subprocess.Popen]:
    """`python -m bench.<module> args` in `world` processes of one torchrun-style group; rank 0's
    command line after `rank0_prefix` (a profiler)."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        # TORCHELASTIC_RUN_ID: the job attempt every rank names alike (the checkpoint writer's lock)
        env = child_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                         "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         "OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": f"bench-{port}"})
        prefix = list(rank0_prefix) if rank == 0 else []
        procs.append(subprocess.Popen([*prefix, sys.executable, "-m", f"bench.{module}", *args], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def rank0_result(procs: List[subprocess.Popen], what: str, timeout: float = 600) -> Dict:
    """Wait for every rank; rank 0's last JSON line, or an error with every rank's stderr tail."""
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    lines = [ln for ln in outs[0][0].splitlines() if ln.startswith("{")]
    if any(p.returncode for p in procs) or not lines:
        raise RuntimeError(f"{what}: ranks exited {[p.returncode for p in procs]}: "
                           f"{[o[1].strip()[-800:] for o in outs]}")
    return json.loads(lines[-1])


def run_ranks(module: str, args: List[str], out: Path, what: str, repeated: List[str],
              world: int = WORLD) -> Dict:
    """rank0_result of one launch, launched once more if a rank failed (see twice)."""
    return twice(lambda: rank0_result(start_ranks(module, args, world), what), out, repeated)


def twice(launch: Callable[[], T], out: Path, repeated: List[str]) -> T:
    """launch(), called once more if it raised RuntimeError (a rank failed); `repeated` gets why.
    The second call starts from an empty `out`: a TrainLoop must not resume the first's."""
    try:
        return launch()
    except RuntimeError as err:
        repeated.append(str(err)[-300:])
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        return launch()


def repeated_note(repeated: List[str]) -> List[str]:
    return [f"{len(repeated)} launch(es) failed and were launched again; the first: {repeated[0]}"] if repeated else []
