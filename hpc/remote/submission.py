"""A submission to a named cluster: push the code, then python -m hpc.submit on its login node.

    python -m hpc.submit tests.tiny_pipeline --cluster jean-zay [--dry-run]

The request is checked here first (the pipeline loads, its options convert: hpc.submit's own
parsing), then: one probe (hpc there and its version, the runs root, whether the code tree is
there), the push of what is missing (hpc.remote.push), and hpc.submit run by the cluster's
interpreter in the pushed tree, with --cluster slurm and a run directory under the cluster's runs
root, named here and printed before anything is submitted. The run directory, with its snapshot,
manifest and every job's state, lives on the cluster: nothing on this machine is needed later.
A submission cut off by a dropped connection says so, and the same command with that --run-dir
submits only the tasks not already queued (the run's manifest and hpc's submission token, there).
The cluster entry's profile is the default --profile and its partition, account and qos are given
to every stage, before the user's own key=value overrides, which win.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import time
import typing
from pathlib import Path
from typing import List

from hpc.pipeline.plan import PipelineDef, get_pipeline
from hpc.pipeline.request import Request, Submitted
from hpc.remote import clusters, push
from hpc.remote.ssh import RemoteError, Shell, last_line

KIND = "remote"  # Submitted.kind of a run on a named cluster


def stage_names(pipe: PipelineDef) -> List[str]:
    """The stages the pipeline's schema knows ([] when it does not say)."""
    try:
        stages = typing.get_type_hints(pipe.schema)["stages"]
        return [f.name for f in dataclasses.fields(stages)]
    except (KeyError, TypeError, NameError):
        return []


def remote_args(req: Request, cluster: clusters.Cluster, run_dir: str) -> List[str]:
    """hpc.submit's arguments on the cluster: the request's, with the entry's defaults under them."""
    pipe = get_pipeline(req.pipeline)
    defaults = [f"stages.{s}.{k}={v}" for s in stage_names(pipe) for k, v in cluster.defaults().items()]
    args = [req.pipeline, *defaults, *req.overrides, *dataclasses.replace(req, cluster=None).flags()]
    if req.sweep is not None:  # every token after --sweep up to the next option is an axis
        args += ["--sweep", *req.sweep]
    args += ["--cluster", "slurm", "--run-dir", run_dir]
    profile = req.profile or cluster.profile
    args += ["--profile", profile] if profile else []
    args += ["--sweep-file", req.sweep_file] if req.sweep_file else []
    flags = {"--dry-run": req.dry_run, "--wait": req.wait, "--same-snapshot": req.same_snapshot}
    return args + [flag for flag, on in flags.items() if on]


def run_dir_for(req: Request, runs: str) -> str:
    """The run directory there: the request's (relative: under the runs root), or a new name."""
    if req.run_dir:
        return os.path.join(runs, req.run_dir)
    name = get_pipeline(req.pipeline).name
    return os.path.join(runs, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")


def start(req: Request, cwd: Path = Path(".")) -> Submitted:
    cluster = clusters.find(str(req.cluster))
    shell = Shell(cluster)
    tree = push.local_tree(cwd)
    where_in_tree = os.path.relpath(cwd.resolve(), tree.root)
    if req.dry_run:
        return show(req, shell, tree, where_in_tree)
    landing, code, _ = push.push(shell, tree)
    run_dir = run_dir_for(req, landing.runs)
    address = f"{cluster.name}:{run_dir}"
    args = remote_args(req, cluster, run_dir)
    print(f"run dir: {address} (code {code})", flush=True)
    try:
        done = shell.run(shell.python(["-m", "hpc.submit", *args], cwd=os.path.normpath(os.path.join(code, where_in_tree))),
                         "submitting", capture=False)
    except RemoteError as err:
        raise RemoteError(f"{err}; the submission may have reached the cluster: python -m hpc.status {address} "
                          f"shows it, and the same command with --run-dir {run_dir} submits only what is not "
                          "queued") from None
    said = done.stderr.decode(errors="replace")
    if done.returncode:
        sys.stderr.write(said[:len(said.rstrip()) - len(last_line(said))])
        raise RemoteError(f"python -m hpc.submit on cluster {cluster.name} exited with {done.returncode}: "
                          f"{last_line(said).removeprefix('error: ') or 'no message'}")
    sys.stderr.write(said)
    return Submitted(Path(run_dir), KIND, {})


def show(req: Request, shell: Shell, tree: push.Tree, where_in_tree: str) -> Submitted:
    """--dry-run: the ssh commands a submission would run, without connecting."""
    c = shell.cluster
    run_dir = run_dir_for(req, c.runs)
    code = os.path.join(c.runs, ".hpc-code", "trees", tree.tree)
    print(f"cluster {c.name}: {len(tree.files)} files of {tree.root} as tree {tree.tree}; would run, over one "
          "connection (PROBE: hpc.remote.push.PROBE, hpc's version, the runs root, whether the tree is there):")
    print("  " + shell.shown(shell.python(["-c", "PROBE", c.runs, tree.tree])))
    print("  " + shell.shown(shell.python(["-m", "hpc.remote.store", "put", os.path.join(c.runs, ".hpc-code")]))
          + "   # only when the tree is not there; sends the files it lacks")
    args = remote_args(req, c, run_dir)
    print("  " + shell.shown(shell.python(["-m", "hpc.submit", *args], cwd=os.path.normpath(os.path.join(code, where_in_tree)))))
    return Submitted(Path(run_dir), KIND, {})
