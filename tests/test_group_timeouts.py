"""Every process group hpc makes follows the session's timeouts: real 2-rank gloo groups on the CPU.

    python -m pytest -q tests/test_group_timeouts.py

The DCP engine makes a group of its own (hpc.checkpoint.dcp_engine); a rank that does not join one
of its collectives must fail the others after the session's timeout_s (or train_timeout_s once
training started), as on the default group, not after torch's 30 minutes for a new group.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import ranklaunch
from test_ddp_session import free_port

WORKLOAD = Path(__file__).with_name("timeout_workload.py")
REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 3.0
SLACK_S = 10.0  # gloo notices a timeout on its next poll; a loaded 2-core machine adds some (torch: 1800 s)


def start_pair(out: Path, mode: str, port: int) -> list[subprocess.Popen]:
    procs = []
    for rank in range(2):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(ranklaunch.popen([sys.executable, str(WORKLOAD), str(out), mode, str(TIMEOUT_S)],
                                      env=env, stderr=subprocess.PIPE, text=True))
    return procs


def test_a_dcp_collective_a_rank_misses_times_out_with_the_session(tmp_path):
    """start: timeout_s; train: train_timeout_s, switched after the engine's group was made.
    Both pairs run at once; on torch's default each would wait 30 minutes (killed here after 60 s)."""
    ports = [free_port()]
    while len(ports) < 2:  # the pairs start before either binds: free_port could draw one port twice
        ports += [p for p in [free_port()] if p != ports[0]]
    pairs = {mode: start_pair(tmp_path / mode, mode, port) for mode, port in zip(("start", "train"), ports)}
    try:
        for mode, procs in pairs.items():
            try:
                errors = [p.communicate(timeout=60)[1] for p in procs]
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{mode}: rank 0 still waits after 60 s for a timeout of {TIMEOUT_S} s")
            assert [p.returncode for p in procs] == [0, 0], f"{mode}:\n" + "\n".join(errors)
            report = json.loads((tmp_path / mode / "rank-0.json").read_text())
            # gloo says "Timed out" in a collective, the store "wait timeout" while a pair connects
            assert re.search(r"timed out|timeout", report["error"] or "", re.I), f"{mode}: {report['error']}"
            assert TIMEOUT_S - 0.5 <= report["waited"] <= TIMEOUT_S + SLACK_S, \
                f"{mode}: rank 0 waited {report['waited']:.1f} s for a timeout of {TIMEOUT_S} s: {report['error']}"
    finally:
        for p in (p for procs in pairs.values() for p in procs):
            p.kill()
            p.wait()
