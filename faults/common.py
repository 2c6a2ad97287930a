"""What the fault campaigns share: victims to kill, the checkpoints they write, and how a loss is told.

    python -c "from faults.checkpoint import sigkill_saves as f; print(f(__import__('pathlib').Path('/tmp/x'), 3, 0))"

Every campaign (faults.checkpoint, faults.disk, faults.resume) takes (scratch
directory, count, seed) and returns an Outcome: faults injected, and how many of them lost
something. The reliability report (faults.reliability) runs each once with a large count, the tests
(tests/test_checkpoint_faults.py) with small counts.

Victims are forked from the calling process (torch already imported, so a kill costs milliseconds,
not an interpreter start) and put in their own process group, which is killed whole, as SLURM
kills a job: a forked checkpoint writer dies with its trainer. A kill returns only once every
process of the group has exited, so the next writer never meets the lock of a dying one.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from hpc.checkpoint import CheckpointStore

_FORK = multiprocessing.get_context("fork")
SIZE = 1 << 18  # floats per test checkpoint: 1 MiB, long enough to be killed in the middle
GROUP_EXIT_S = 30.0  # a killed group that has not exited by then is an error, not a wait


@dataclass
class Outcome:
    faults: int  # faults injected
    lost: int  # faults after which something committed did not load, or a load was wrong
    detail: str = ""  # what was checked, and the first failure seen

    def add(self, problem: str) -> None:
        """Count one fault and whether `problem` (a non-empty text) says it lost something."""
        self.faults += 1
        self.lost += bool(problem)
        if problem and "; first loss: " not in self.detail:
            self.detail += f"; first loss: {problem}"


def expected_state(step: int, copy: int = 0) -> dict:
    """The checkpoint the campaigns' writers save at `step` (`copy` tells re-saves apart)."""
    return {"w": torch.full((SIZE,), float(step)), "step": step, "copy": copy, "per_rank": {"pos": step}}


def consistency(state: dict | None) -> str:
    """'' when `state` is one whole checkpoint of expected_state, else what is wrong."""
    if state is None:
        return "nothing loaded"
    step = state.get("step")
    good = isinstance(step, int) and torch.equal(state["w"], torch.full((SIZE,), float(step))) \
        and state.get("per_rank") == {"pos": step}
    return "" if good else f"checkpoint of step {step} mixes files of different steps"


def quiet_load(directory: Path, **kwargs: Any) -> dict | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CheckpointStore(directory, **kwargs).load()


class Victim:
    """`target(out, *args)` in a forked process of its own process group; `out` is a line-buffered
    text pipe back to this process."""

    def __init__(self, target: Callable[..., None], *args: object) -> None:
        read, self._write = os.pipe()
        self.proc = _FORK.Process(target=self._run, args=(target, args), daemon=True)
        self.proc.start()
        os.close(self._write)
        self._out = os.fdopen(read)
        self.first = self._out.readline().strip()  # "started": the victim's group exists from here on

    def _run(self, target: Callable[..., None], args: tuple) -> None:
        os.setpgid(0, 0)
        # The parent may have run OpenMP work: its thread team does not exist in a forked child,
        # and the child's first parallel kernel would wait for it forever. One thread never asks.
        torch.set_num_threads(1)
        out = os.fdopen(self._write, "w", buffering=1)
        out.write("started\n")
        target(out, *args)

    def readline(self) -> str:
        """The victim's next line ('' once it has exited)."""
        return self._out.readline()

    def wait_for(self, prefix: str) -> str:
        """Read up to the first line starting with `prefix`; '' if the victim exited first."""
        while True:
            line = self._out.readline()
            if not line or line.startswith(prefix):
                return line.strip()

    def kill(self, sig: int = signal.SIGKILL) -> list[str]:
        """Signal the whole group; for SIGKILL, also wait until every process of it is gone."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            _wait_group_exit(self.proc.pid)
        return self.finish()

    def finish(self) -> list[str]:
        """The victim's remaining lines, once it has exited."""
        lines = self._out.read().splitlines()
        self._out.close()
        self.proc.join()
        return lines


def _wait_group_exit(pgid: int) -> None:
    """Until no process of group `pgid` runs (zombies hold no files, hence no lock)."""
    deadline = time.monotonic() + GROUP_EXIT_S
    while _group_members(pgid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process group {pgid} still runs {GROUP_EXIT_S:.0f}s after SIGKILL")
        time.sleep(0.002)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def save_forever(out, directory: Path, mode: str, keep: int, job: str | None = None) -> None:
    """A writer: resume from `directory`, then save every step ("blocking" or a background `mode`),
    reporting "resumed N [problem]" and "committed N" (a step whose save is known to be complete)."""
    if job is not None:
        os.environ["SLURM_JOB_ID"] = job
    store = CheckpointStore(directory, keep=keep, mode=None if mode == "blocking" else mode)
    state = store.load()
    step = state["step"] if state else 0
    out.write(f"resumed {step} {consistency(state) if state else ''}\n")
    while True:
        step += 1
        store.save(step, expected_state(step), blocking=mode == "blocking")
        done = step if mode == "blocking" else step - 1  # a background save returns once the
        if done > 0:                                      # previous write has committed
            out.write(f"committed {done}\n")


def committed(lines: list[str]) -> int | None:
    """Newest step a save_forever victim reported committed."""
    steps = [int(ln.split()[1]) for ln in lines if ln.startswith("committed")]
    return max(steps) if steps else None
