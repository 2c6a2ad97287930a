"""Submission to a named cluster over ssh: its wall time against a local submission plus one ssh
round trip, the bytes a push sends, and the round trips of a status poll.

    python -m bench --only remote

The "cluster" is the benchmark's local SLURM cluster behind a real sshd on 127.0.0.1 (tests/sshd.py:
its own host key and authorized key); the "laptop" is a process whose PATH holds only a counting
ssh, no SLURM client. Every submission is of the tiny test pipeline (one task per stage, two
stages) from a project without git; the local one runs `python -m hpc.submit` on the cluster's side
with the same project and options. Status polls read runs of held jobs (bench.status_calls), with
counting shims of the scheduler's clients on the cluster's side.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import yaml

from bench.common import Context, count_calls, counting_shims, fmt_s, median
from bench.report import Section
from bench.status_calls import _make_run, _submit_held

REPEATS = 5
SLACK_S = 0.1  # the cluster's side beyond hpc.submit: hpc.remote.land's interpreter start
TASKS = (10, 1000)


def wall(argv: List[str], env: Dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    dt = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"{shlex.join(argv)} failed: {out.stderr.strip()[-500:]}")
    return dt


def laptop_env(base: Path, entry: dict, log: Path) -> Dict[str, str]:
    """A PATH with a counting ssh and nothing else; the named cluster 'bench'."""
    shims = base / "laptop-bin"
    shims.mkdir()
    (shims / "ssh").write_text(f'#!/bin/sh\necho ssh >> "{log}"\nexec /usr/bin/ssh "$@"\n')
    (shims / "ssh").chmod(0o755)
    (base / "clusters.yaml").write_text(yaml.safe_dump({"bench": entry}))
    control = base / "cm"
    control.mkdir(mode=0o700)
    return {"PATH": str(shims), "HOME": os.environ.get("HOME", "/root"), "HPC_CLUSTERS_FILE": str(base / "clusters.yaml"),
            "HPC_SSH_CONTROL_DIR": str(control)}


def run(ctx: Context) -> Section:
    from tests.sshd import project, start  # the tests' sshd: the same login node the tests reach

    sec = Section("remote", "Submission to a named cluster over ssh",
                  "remote submission within local submission + one ssh round trip + the laptop's side + 0.1 s; "
                  "an unchanged tree pushes 0 bytes of code; one round trip per status poll, whatever the task count",
                  "python -m bench --only remote", headers=["measure", "value", "beside it"])
    cluster = ctx.cluster()
    base = ctx.scratch("remote")
    sshd = start(base)
    try:
        env = ctx.slurm_env()
        sched_log, ssh_log = base / "sched.log", base / "ssh.log"
        counting_shims(base / "sched-bin", sched_log, path=env.get("PATH"))
        setup = " && ".join([*(f"export {k}={shlex.quote(v)}" for k, v in cluster.env().items()),
                             f"export PATH={base / 'sched-bin'}:$PATH"])
        laptop = laptop_env(base, sshd.entry(runs=str(base / "runs"), setup=setup), ssh_log)
        proj = project(base / "proj")
        argv = [sys.executable, "-m", "hpc.submit", "mypkg.tiny", "tiny.parts=[0]"]
        wall([*argv, "--cluster", "bench"], laptop, proj)  # the first: opens the connection, pushes the tree
        ssh_log.unlink(missing_ok=True)
        remote = median([wall([*argv, "--cluster", "bench"], laptop, proj) for _ in range(REPEATS)])
        trips = len(ssh_log.read_text().split()) / REPEATS
        local = median([wall([*argv, "--cluster", "slurm", "--run-dir", str(base / f"local-{i}")], env, proj)
                        for i in range(REPEATS)])
        ssh = sshd.entry()
        probe = ["/usr/bin/ssh", "-o", "BatchMode=yes", "-o", f"ControlPath={laptop['HPC_SSH_CONTROL_DIR']}/%C",
                 "-p", str(sshd.port), "-i", ssh["identity"], *[x for k, v in ssh["options"].items()
                                                                 for x in ("-o", f"{k}={v}")], ssh["ssh"], "true"]
        rtt = median([wall(probe, laptop, proj) for _ in range(REPEATS)])
        dry = median([wall([*argv, "--cluster", "bench", "--dry-run"], laptop, proj) for _ in range(REPEATS)])
        sec.rows += [["remote submission (unchanged tree)", fmt_s(remote), f"{trips:g} ssh calls"],
                     ["local submission on the cluster", fmt_s(local), ""],
                     ["one ssh round trip (connection open)", fmt_s(rtt), ""],
                     ["the laptop's side alone (--dry-run: parse, hash the tree)", fmt_s(dry), ""],
                     ["remote - (local + round trip + laptop's side)", fmt_s(remote - local - rtt - dry), ""]]
        sec.verdicts.append((f"remote {fmt_s(remote)} <= local {fmt_s(local)} + round trip {fmt_s(rtt)} + laptop's "
                             f"side {fmt_s(dry)} + {SLACK_S:g} s", remote <= local + rtt + dry + SLACK_S))
        sec.rows += pushed(sec, [*argv, "--cluster", "bench"], laptop, proj)
        for n in TASKS:
            sec.rows.append(poll(sec, cluster, env, laptop, proj, base, n, ssh_log, sched_log))
    finally:
        sshd.proc.terminate()
        sshd.proc.wait(timeout=10)
    sec.notes += [f"median of {REPEATS}; each submission and poll a fresh `python -m hpc.submit` or "
                  "`python -m hpc.status` process on the laptop (interpreter start included)",
                  "a remote submission with the tree on the cluster is one ssh call: hpc.remote.land (hpc's "
                  "version, the tree) replaces itself with hpc.submit there; a changed tree adds the push and "
                  "the call again",
                  "a round trip here includes the login shell the sshd starts per call (the user's .bashrc)"]
    return sec


def pushed(sec: Section, argv: List[str], laptop: Dict[str, str], proj: Path) -> List[List[str]]:
    """Bytes of code sent for the unchanged tree and after one edited file, as the submission says them."""
    said = []
    for edit in (False, True):
        edited = proj / "mypkg" / "tiny.py"
        if edit:
            edited.write_text(edited.read_text() + "\n# edited\n")
        out = subprocess.run(argv, env=laptop, cwd=proj, capture_output=True, text=True, timeout=300)
        found = re.search(r"^pushed (\d+) bytes of code", out.stderr, re.M)
        said.append(int(found.group(1)) if found else 0)
    total = sum(p.stat().st_size for p in proj.rglob("*") if p.is_file())
    files = sum(1 for p in proj.rglob("*") if p.is_file())
    sec.verdicts.append((f"an unchanged tree pushes {said[0]} bytes of code", said[0] == 0))
    return [["bytes of code pushed, unchanged tree", str(said[0]), f"tree of {total} bytes, {files} files"],
            ["bytes of code pushed, one file edited", str(said[1]), f"that file: {edited.stat().st_size} bytes"]]


def poll(sec: Section, cluster, env, laptop, proj, base: Path, n: int, ssh_log: Path, sched_log: Path) -> List[str]:
    ids = _submit_held(cluster, n, base)
    try:
        run_dir = base / f"held-{n}"
        _make_run(run_dir, ids)
        ssh_log.unlink(missing_ok=True)
        sched_log.unlink(missing_ok=True)
        walls = [wall([sys.executable, "-m", "hpc.status", f"bench:{run_dir}"], laptop, proj) for _ in range(3)]
    finally:
        cluster.run(["scancel", *sorted({i.split("_")[0] for i in ids})], check=False)
    trips = len(ssh_log.read_text().split()) / 3
    calls = sum(count_calls(sched_log).values()) / 3
    sec.verdicts.append((f"{n} tasks: {trips:g} ssh round trip(s) per status poll", trips == 1))
    return [f"status poll of {n} tasks", fmt_s(median(walls)), f"{trips:g} ssh call(s), {calls:g} scheduler call(s)"]
