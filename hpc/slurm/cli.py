"""Running SLURM's client programs, and asking whether a controller answers.

    python -c "from hpc import scheduler; k = scheduler.detect('auto'); print(k, k.why_not_slurm)"

Whether SLURM is here is asked of SLURM (`scontrol ping`, short timeout), never read from a file: a
configless site has no slurm.conf on its login nodes. `run` is the one way hpc runs sinfo, sacct,
squeue, scontrol and scancel: a client that exits non-zero raises SlurmExit with SLURM's last words.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Callable, List, Mapping, Optional, Tuple

PING_TIMEOUT_S = 5.0  # a configless client without DNS SRV records may otherwise hang on lookups


# ---------------------------------------------------------------- is SLURM here?
def ping(timeout_s: float = PING_TIMEOUT_S) -> Tuple[bool, str]:
    """(whether a controller answered, what was seen): `scontrol ping`, as a client of this shell."""
    if not shutil.which("scontrol"):
        return False, "scontrol is not on PATH"
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"scontrol ping gave no answer within {timeout_s:g} s"
    except OSError as err:
        return False, f"scontrol ping could not run: {err}"
    if " is UP" in out.stdout:  # a backup controller may be DOWN while the primary answers
        return True, out.stdout.strip().splitlines()[0]
    seen = (out.stderr.strip() or out.stdout.strip() or f"exit status {out.returncode}").splitlines()[-1]
    return False, f"scontrol ping: {seen}"


class Kind(str):
    """An executor kind ("slurm", "local", "debug") that remembers why `auto` did not pick SLURM,
    so the plan can say so (hpc.pipeline.plan.make_plan reads `why_not_slurm`)."""

    why_not_slurm: str = ""

    def __new__(cls, kind: str, why_not_slurm: str = "") -> "Kind":
        obj = super().__new__(cls, kind)
        obj.why_not_slurm = why_not_slurm
        return obj


def detect(kind: str) -> Kind:
    """auto -> slurm when a controller answers, else local with the reason; other kinds are kept."""
    if kind != "auto":
        return Kind(kind)
    answered, seen = ping()
    return Kind("slurm") if answered else Kind("local", seen)


class SlurmExit(RuntimeError):
    """A SLURM client ran and exited non-zero; the message ends with its last line of stderr.
    `returncode` is the client's (negative: it died of that signal, and never gave an answer)."""

    def __init__(self, message: str, returncode: int = 1):
        super().__init__(message)
        self.returncode = returncode


def run(cmd: List[str], env: Optional[Mapping[str, str]] = None, timeout_s: float = 60,
        runner: Callable[..., Any] = subprocess.run) -> str:
    """Run a SLURM client and return its stdout; `runner` runs it (subprocess.run's arguments)."""
    try:
        out = runner(cmd, capture_output=True, text=True, timeout=timeout_s,
                     env=dict(os.environ if env is None else env))
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"{cmd[0]} failed: {err}. HINT: does `scontrol ping` answer in this shell?") from None
    if out.returncode != 0:
        # SLURM's clients print a chain of errors; the last line is the one that decided
        last = (out.stderr.strip().splitlines() or ["no message"])[-1].strip()
        raise SlurmExit(f"{' '.join(cmd[:2])} exited {out.returncode}: {last}. "
                        "HINT: does `scontrol ping` answer in this shell?", out.returncode)
    return out.stdout
