"""Which code a submission ran: the git commit and checkout of the user's code, and hpc's version.

    python -c "from hpc.rundir.codeversion import code_version; print(code_version(None))"

The manifest (hpc.rundir.run) records what code_version() returns with each submission, and the
code snapshot (hpc.rundir.codefiles) copies the checkout it found.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from hpc import __version__

GIT_HEAD = ["git", "rev-parse", "HEAD", "--show-toplevel"]  # the commit, then the checkout's root


def code_version(module_file: Optional[str], cwd: Optional[Path] = None) -> Dict[str, Any]:
    """What the manifest records about the submitted code: the git commit of the user's code and
    hpc's version beside it. The user's code is the checkout of `module_file` (the pipeline's module;
    None for pipelines that ship with hpc), else that of the working directory, where a `run`
    pipeline's script lives."""
    places = [Path(module_file).resolve().parent] if module_file else []
    places.append(Path(cwd or os.getcwd()))
    commit = root = None
    for place in places:
        commit, root = _git_head(place)
        if commit:
            break
    return {"git_commit": commit, "code_dir": root, "hpc_version": hpc_version()}


def _git_head(place: Path) -> Tuple[Optional[str], Optional[str]]:
    """(commit, checkout root) of the git checkout holding `place`; (None, None) outside one."""
    try:
        out = subprocess.run(GIT_HEAD, cwd=place,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    lines = out.stdout.split("\n")
    return (lines[0], lines[1]) if out.returncode == 0 and len(lines) > 1 else (None, None)


def hpc_version() -> str:
    # hpc.__version__, the one pyproject.toml also states: importlib.metadata would scan every
    # installed distribution, a cost of the same order as importing submitit, on every submission.
    return __version__
