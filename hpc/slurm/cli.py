"""Running SLURM's client programs, and asking whether a controller answers.

    python -c "from hpc import scheduler; k = scheduler.detect('auto'); print(k, k.why_not_slurm)"

Whether SLURM is here is asked of SLURM (`scontrol ping`, short timeout), never read from a file: a
configless site has no slurm.conf on its login nodes. `run` is the one way hpc runs sinfo, sacct,
squeue, scontrol, scancel and sbatch: a transient failure (a busy or restarting controller, slurmdbd
unreachable: hpc.slurm.retry's table) is asked again with backoff and jitter under a total deadline,
one line on stderr per retry; a refusal, or the deadline passed, raises SlurmExit with SLURM's last
words. With nothing failing it adds no call and no pause.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, List, Mapping, Optional, Tuple

from hpc.slurm import retry

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
        runner: Callable[..., Any] = subprocess.run, deadline_s: Optional[float] = None,
        lookup: Optional[Callable[[], Optional[str]]] = None) -> str:
    """Run a SLURM client and return its stdout; `runner` runs it (subprocess.run's arguments).

    Transient failures are retried until `deadline_s` (default: hpc.slurm.retry.deadline_s()) has
    passed since the first try; each try waits `timeout_s` at most, and no longer than the deadline.
    sbatch whose failure may have queued the job all the same (a timeout: the answer was lost) is
    tried again only when `lookup` is given and finds nothing: `lookup()` returns the stdout the lost
    answer would have been (the job id) when the job is in the queue after all, else None."""
    budget = retry.deadline_s() if deadline_s is None else deadline_s
    # a caller's own deadline bounds the first try too (a stop has its grace time, not a minute)
    first = timeout_s if deadline_s is None else min(timeout_s, max(1.0, deadline_s))
    start, attempt, wait = time.monotonic(), 1, first
    while True:
        words, code, said = _try(cmd, env, wait, runner)
        if code == 0:
            return words
        left = budget - (time.monotonic() - start)
        unsure = cmd[0] == "sbatch" and retry.may_have_acted(said)
        if unsure and lookup is not None:
            try:
                found = lookup()
            except RuntimeError as err:  # the controller that lost sbatch's answer may not answer squeue either
                raise SlurmExit(f"{' '.join(cmd[:2])} {'exited ' + str(code) + ': ' if code else ''}{words}; the job "
                                f"may have been queued all the same, and looking for it failed ({err}). HINT: "
                                "see squeue --me before you submit again", code or 1) from None
            if found is not None:
                return found
        pause = retry.wait_s(attempt)
        if retry.classify(said) != retry.TRANSIENT or (unsure and lookup is None) or pause > left:
            tried = f" (tried {attempt} times over {time.monotonic() - start:.0f} s)" if attempt > 1 else ""
            queued = "; the job may have been queued all the same" if unsure and lookup is None else ""
            seen = words if code is None else f"exited {code}: {words}"
            message = f"{' '.join(cmd[:2])} {seen}{tried}{queued}. HINT: does `scontrol ping` answer in this shell?"
            raise RuntimeError(message) if code is None else SlurmExit(message, code)
        print(retry.retry_line(cmd[0], words, pause, attempt, left - pause), file=sys.stderr, flush=True)
        time.sleep(pause)
        attempt, wait = attempt + 1, min(timeout_s, max(1.0, left - pause))


def _try(cmd: List[str], env: Optional[Mapping[str, str]], timeout_s: float,
         runner: Callable[..., Any]) -> Tuple[str, Optional[int], str]:
    """One run of the client: (stdout, 0, ''), else (its last line of stderr, its exit status or None
    when it gave no answer in time, all of its stderr: the table reads the whole chain of errors)."""
    try:
        out = runner(cmd, capture_output=True, text=True, timeout=timeout_s,
                     env=dict(os.environ if env is None else env))
    except subprocess.TimeoutExpired:
        said = f"gave no answer within {timeout_s:.3g} s"
        return said, None, said
    except OSError as err:
        raise RuntimeError(f"{cmd[0]} failed: {err}. HINT: does `scontrol ping` answer in this shell?") from None
    if out.returncode != 0:
        # SLURM's clients print a chain of errors; the last line is the one that decided
        return (out.stderr.strip().splitlines() or ["no message"])[-1].strip(), out.returncode, out.stderr
    return out.stdout, 0, ""
