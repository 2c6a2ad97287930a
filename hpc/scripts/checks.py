"""Mistakes in a `run` submission that would only show in the job, found before it is submitted.

    check_importable(preset, ["python", "train.py"])   # ConfigError, one line with a HINT
    check_world_sizes(preset, command, (1, 2), 8)      # a node range the command line rules out

The job's interpreter is the command's own (`python`, `python3.11`, /opt/env/bin/python) or, for a
launcher such as `accelerate` or `torchrun`, the one its entry-point script names on its #! line.
One subprocess that only looks the packages up (importlib.util.find_spec: nothing is imported).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

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


# torchtitan's parallelism degrees, in either spelling of its command line (`--parallelism.x 2`, `--x=2`)
DEGREES = re.compile(r"^--parallelism\.(tensor_parallel_degree|pipeline_parallel_degree|context_parallel_degree|"
                     r"data_parallel_replicate_degree|data_parallel_shard_degree|expert_parallel_degree)$")
LIGHTNING_TOPOLOGY = {"--trainer.num_nodes": "nodes", "--trainer.devices": "devices"}


def _options(command: Sequence[str]) -> Dict[str, str]:
    """--key value and --key=value pairs of a command line."""
    found: Dict[str, str] = {}
    for i, arg in enumerate(command):
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            if not eq and i + 1 < len(command) and not command[i + 1].startswith("--"):
                value = command[i + 1]
            found[key] = value
    return found


def check_world_sizes(preset: Any, command: Sequence[str], nodes: Tuple[int, int], tasks_per_node: int) -> None:
    """A node range whose world sizes the script's own command line rules out."""
    options = _options(command)
    worlds = range(nodes[0] * tasks_per_node, nodes[1] * tasks_per_node + 1, tasks_per_node)
    if preset.name == "torchtitan":
        product, named = 1, []
        for key, value in options.items():
            if DEGREES.match(key) and value.lstrip("-").isdigit() and int(value) > 1:
                product *= int(value)
                named.append(f"{key}={value}")
        bad = [w for w in worlds if w % product]
        if bad:
            raise ConfigError(f"{' x '.join(named)} needs a multiple of {product} ranks, but the node range gives "
                              f"{bad[0]}. HINT: choose --nodes so that nodes x {tasks_per_node} is a multiple of "
                              f"{product}, or lower the degrees")
    if preset.name == "lightning":
        for key, what in LIGHTNING_TOPOLOGY.items():
            value = options.get(key, "")
            given = nodes if what == "nodes" else (tasks_per_node, tasks_per_node)
            if value.isdigit() and not given[0] <= int(value) <= given[1] or (value.isdigit() and given[0] != given[1]):
                raise ConfigError(f"{key}={value} fixes the {what} Lightning checks against SLURM's, but the job "
                                  f"gets {given[0]}{'-' + str(given[1]) if given[1] != given[0] else ''}. HINT: drop "
                                  f"{key}: hpc passes the allocation's as PL_TRAINER_* defaults")
