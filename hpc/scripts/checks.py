"""Mistakes in a `run` submission that would only show in the job, found before it is submitted.

    check_importable(preset, ["python", "train.py"])   # ConfigError, one line with a HINT

The job's interpreter is the command's own (`python`, `python3.11`, /opt/env/bin/python) or, for a
launcher such as `accelerate` or `torchrun`, the one its entry-point script names on its #! line.
One subprocess that only looks the packages up (importlib.util.find_spec: nothing is imported).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any, Optional, Sequence

from hpc.config.checks import ConfigError

FIND = "import importlib.util as u, sys; sys.exit(0 if any(u.find_spec(p) for p in sys.argv[1:]) else 3)"


def interpreter(command: Sequence[str]) -> Optional[str]:
    """The Python that will run the command's script, or None when it cannot be told."""
    if not command:
        return None
    exe = shutil.which(command[0]) or (command[0] if os.path.isfile(command[0]) else None)
    if exe is None:
        return None
    if os.path.basename(exe).startswith("python"):
        return exe
    try:
        with open(exe, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if first.startswith(b"#!") and b"python" in first:
        parts = first[2:].decode(errors="replace").split()
        return shutil.which(parts[-1]) if parts and parts[0].endswith("env") else (parts[0] if parts else None)
    return None


def check_importable(preset: Any, command: Sequence[str]) -> None:
    """The preset's framework must be importable by the job's interpreter."""
    if not preset.packages:
        return
    python = interpreter(command) or sys.executable
    try:
        found = subprocess.run([python, "-c", FIND, *preset.packages], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"could not ask {python} for {' or '.join(preset.packages)} ({err}). HINT: check the "
                          "command's interpreter, or pass --framework none") from None
    if found.returncode == 3:
        raise ConfigError(f"framework preset {preset.name!r} needs {' or '.join(preset.packages)}, which {python} "
                          f"cannot import. HINT: pip install {preset.packages[0]} into that environment, or pass "
                          "--framework none")
