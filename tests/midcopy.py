"""A copy killed half-way: SIGKILL a process once a file of its copy exists in a `.tmp-*` folder."""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path


def kill_mid_copy(proc: subprocess.Popen, parent: Path, timeout: float = 60) -> None:
    """Wait until `proc` has copied a file into a `.tmp-*` folder of `parent`, then SIGKILL it (as
    SLURM or a user's kill -9 would)."""
    try:
        deadline = time.monotonic() + timeout
        while not [p for p in parent.glob(".tmp-*/**/*") if p.is_file()]:
            assert proc.poll() is None and time.monotonic() < deadline, "the submission never started copying"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
