"""What every benchmark shares: timing, child Python processes, the benchmark's own SLURM cluster.

    with Context(quick=True) as ctx:
        cluster = ctx.cluster()          # a LocalCluster in a temporary directory, started once
        seconds = timed(["sbatch", "--version"], env=cluster_env)

Children run `python -m bench.<module> ...` so that torch, memory peaks and signal handlers stay out
of the process that writes the report.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from hpc.runtime.ports import free_port  # noqa: F401 (the benchmarks' ranks rendezvous on one: bench.ranks)

REPO = Path(__file__).resolve().parent.parent
# Scheduler clients whose calls bench.status counts.
SCHEDULER_COMMANDS = ("sacct", "squeue", "scontrol", "sinfo", "sbatch", "scancel", "srun")


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def proc_io() -> Dict[str, int]:
    """This process's I/O counters (/proc/self/io): rchar counts every read call, page cache included;
    read_bytes what came from the disk."""
    return {k: int(v) for k, v in (line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())}


def fmt_mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def fmt_s(x: float) -> str:
    return f"{round(x * 1000)} ms" if x < 1 else f"{x:.2f} s"  # round(): an int, never "-0 ms"


def child_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def timed(argv: List[str], env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
          timeout: float = 300) -> float:
    """Wall time of one command; a failure is an error naming the command and its stderr."""
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    dt = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"`{' '.join(argv)}` exited {out.returncode}: {out.stderr.strip()[-1500:]}")
    return dt


def run_child(module: str, args: List[str], env: Optional[Dict[str, str]] = None,
              timeout: float = 600) -> Dict[str, Any]:
    """Run `python -m bench.<module> args`; its last stdout line is a JSON object of results."""
    argv = [sys.executable, "-m", f"bench.{module}", *args]
    out = subprocess.run(argv, env=child_env(env), capture_output=True, text=True, timeout=timeout,
                         cwd=REPO)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"`{' '.join(argv[1:])}` exited {out.returncode}: "
                           f"{(out.stderr or out.stdout).strip()[-1500:]}")
    return json.loads(lines[-1])


def emit(result: Dict[str, Any]) -> None:
    """The child side of run_child."""
    print(json.dumps(result), flush=True)


def fsync_write_seconds(path: Path, nbytes: int, chunk: int = 64 << 20) -> float:
    """Time to write `nbytes` to a new file and fsync it: the disk's durable bandwidth, measured now."""
    block = os.urandom(min(chunk, nbytes) or 1)
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        left = nbytes
        while left > 0:
            n = min(left, len(block))
            fh.write(block[:n])
            left -= n
        fh.flush()
        os.fsync(fh.fileno())
    dt = time.perf_counter() - t0
    path.unlink()
    return dt


class Context:
    """Options of this run, a scratch directory, and the cluster (started on first use)."""

    def __init__(self, quick: bool = False, keep: bool = False, cluster_dir: Optional[str] = None,
                 launches: Optional[int] = None):
        self.quick = quick
        self.launches = launches  # interleaved pairs (fsdp): launches per pair instead of the default
        self.keep = keep
        self.tmp = Path(tempfile.mkdtemp(prefix="hpc-bench-"))
        # A cluster directory given by the caller is used as is (started if needed) and left up.
        self.cluster_dir = Path(cluster_dir) if cluster_dir else None
        self._cluster: Any = None
        self._cluster_error: Optional[str] = None

    def scratch(self, name: str) -> Path:
        d = self.tmp / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def cluster(self) -> Any:
        """The benchmark's own LocalCluster; raises RuntimeError with the reason if it cannot start."""
        if self._cluster is None and self._cluster_error is None:
            try:
                from hpc.cluster import LocalCluster

                c = LocalCluster(self.cluster_dir or self.tmp / "cluster")
                c.up(log=lambda msg: None)
                self._cluster = c
            except Exception as err:  # ImportError, ClusterError, missing binaries
                self._cluster_error = f"{type(err).__name__}: {err}"
        if self._cluster is None:
            raise RuntimeError(f"local SLURM cluster unavailable ({self._cluster_error})")
        return self._cluster

    def slurm_env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        env = child_env(self.cluster().env())
        env.update(extra or {})
        return env

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._cluster is not None and self.cluster_dir is None:
            self._cluster.down(log=lambda msg: None)
        if not self.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def counting_shims(directory: Path, log: Path, path: Optional[str] = None) -> List[str]:
    """Wrapper scripts that append their name to `log`, then exec the real scheduler client.

    Put `directory` first on PATH to count calls; the real binary answers every call.
    Returns the commands wrapped.
    """
    directory.mkdir(parents=True, exist_ok=True)
    wrapped = []
    for name in SCHEDULER_COMMANDS:
        real = shutil.which(name, path=path)
        if real is None:
            continue
        shim = directory / name
        shim.write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)
        wrapped.append(name)
    return wrapped


def count_calls(log: Path) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    if log.exists():
        for name in log.read_text().split():
            counts[name] = counts.get(name, 0) + 1
    return counts


def best_effort(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # cleanup only: the measurement already happened
        pass
