"""Users' scripts that end without destroy_process_group(): a finished rank must never count as failed.

    python -c "from faults.teardown import script_exits as f; print(f(__import__('pathlib').Path('/tmp/x'), 20, 0))"

Each run is a plain 2-rank gloo script (one all_reduce, then the end of the script, with no
destroy_process_group(), as the HF Trainer's scripts end), started twice side by side: once bare, once as
hpc's `run` wrapper starts it (hpc/scripts/site/ first on PYTHONPATH, HPC_EXIT_RECORD set:
hpc.scripts.scriptexit). Bare, a rank now and then aborts at exit in gloo's teardown ("terminate called
without an active exception", SIGABRT): under hpc before scriptexit, a failed rank whose step was run
again. Under hpc, a rank is lost when the wrapper counts it as failed (scriptexit.status is not 0).
The row says how many bare runs aborted, and how many under hpc aborted and were recognised.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from faults.common import Outcome
from hpc.scripts import hooks, scriptexit

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair(script: Path, hpc: bool, quiet: Path) -> list:
    """Run the script's 2 ranks; each rank's (exit status, status as hpc's wrapper counts it)."""
    port, procs, records = _port(), [], []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
               "RANK": str(rank), "OMP_NUM_THREADS": "1"}
        env.pop(scriptexit.ENV, None)
        records.append(tempfile.mkdtemp(prefix="exit-", dir=script.parent) if hpc else "")
        if hpc:
            env.update(PYTHONPATH=os.pathsep.join([str(hooks.SITE), str(REPO)]), **{scriptexit.ENV: records[-1]})
        with open(quiet, "ab") as err:
            procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stderr=err))
    codes = [p.wait(timeout=300) for p in procs]
    with contextlib.redirect_stderr(io.StringIO()):  # the wrapper's line for a recognised abort
        return [(c, scriptexit.status(c, r, p.pid, n) if hpc else c)
                for n, (c, r, p) in enumerate(zip(codes, records, procs))]


def script_exits(scratch: Path, count: int, seed: int = 0) -> Outcome:
    """`count` runs bare and `count` under hpc's exit, alternately (the machine's load alike for both)."""
    scratch.mkdir(parents=True, exist_ok=True)
    script = scratch / "no_destroy.py"
    script.write_text(SCRIPT)
    bare = hpc_aborts = 0
    outcome = Outcome(0, 0)
    for _ in range(count):
        bare += any(code != 0 for code, _ in _pair(script, False, scratch / "stderr.txt"))
        ranks = _pair(script, True, scratch / "stderr.txt")
        hpc_aborts += any(code != 0 for code, _ in ranks)
        failed = [f"exit status {code}" for code, counted in ranks if counted != 0]
        outcome.add(f"a rank counted as failed ({', '.join(failed)})" if failed else "")
    outcome.detail = (f"{count} runs of a 2-rank gloo script that ends without destroy_process_group(), bare and "
                      f"under hpc's exit (hpc.scripts.scriptexit): bare, {bare} of {count} aborted at exit; under "
                      f"hpc, {hpc_aborts} of {count}, and {outcome.lost} with a rank counted as failed (run again)"
                      + outcome.detail)
    return outcome
