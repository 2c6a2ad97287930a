"""A submission to a named cluster: push the code, then python -m hpc.submit on its login node.

    python -m hpc.submit tests.tiny_pipeline --cluster jean-zay [--dry-run]

The request is checked here first (the pipeline loads, its options convert: hpc.submit's own
parsing), then one ssh call (hpc.remote.land) runs hpc.submit by the cluster's interpreter in the
pushed tree named by its hash, with --cluster slurm and a run directory under the cluster's runs
root, printed before anything is submitted. When the cluster lacks the tree, or runs another hpc,
that call says so before submitting: the files it lacks are pushed (hpc.remote.push) and the call
made again (three calls), or the submission is refused with the command that fixes it. The run directory, with its snapshot,
manifest and every job's state, lives on the cluster: nothing on this machine is needed later.
A submission cut off by a dropped connection says so, and the same command with that --run-dir
submits only the tasks not already queued (the run's manifest and hpc's submission token, there).
The cluster entry's profile is the default --profile and its partition, account and qos are given
to every stage, and the file's notify: (the entry's over the top-level one) to the run, before the
user's own key=value overrides, which win.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import subprocess
import sys
import time
import typing
from pathlib import Path
from typing import List, Tuple

import hpc
from hpc.pipeline.plan import PipelineDef, get_pipeline
from hpc.pipeline.request import Request, Submitted
from hpc.remote import clusters, push, ssh
from hpc.remote import land as land_codes
from hpc.remote.ssh import RemoteError, Shell, last_line

KIND = "remote"  # Submitted.kind of a run on a named cluster


def stage_names(pipe: PipelineDef) -> List[str]:
    """The stages the pipeline's schema knows ([] when it does not say)."""
    try:
        stages = typing.get_type_hints(pipe.schema)["stages"]
        return [f.name for f in dataclasses.fields(stages)]
    except (KeyError, TypeError, NameError):
        return []


def remote_args(req: Request, cluster: clusters.Cluster) -> List[str]:
    """hpc.submit's arguments on the cluster (hpc.remote.land adds --run-dir): the request's, with the
    entry's defaults under them."""
    pipe = get_pipeline(req.pipeline)
    defaults = [f"stages.{s}.{k}={v}" for s in stage_names(pipe) for k, v in cluster.defaults().items()]
    defaults += clusters.notify_overrides(cluster)  # the user's notify: for runs there (hpc.config.userfile)
    args = [req.pipeline, *defaults, *req.overrides, *dataclasses.replace(req, cluster=None).flags()]
    if req.sweep is not None:  # every token after --sweep up to the next option is an axis
        args += ["--sweep", *req.sweep]
    args += ["--cluster", "slurm"]
    profile = req.profile or cluster.profile
    args += ["--profile", profile] if profile else []
    args += ["--sweep-file", req.sweep_file] if req.sweep_file else []
    flags = {"--dry-run": req.dry_run, "--wait": req.wait, "--same-snapshot": req.same_snapshot}
    return args + [flag for flag, on in flags.items() if on]


def run_dir_for(req: Request) -> str:
    """The run directory there: the request's, or a new name (relative: under the runs root)."""
    if req.run_dir:
        return req.run_dir
    return f"{get_pipeline(req.pipeline).name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def start(req: Request, cwd: Path = Path(".")) -> Submitted:
    cluster = clusters.find(str(req.cluster))
    shell = Shell(cluster)
    tree = push.local_tree(cwd)
    args = ["-m", "hpc.remote.land", hpc.__version__, cluster.runs, tree.tree,
            os.path.relpath(cwd.resolve(), tree.root), run_dir_for(req), "--", *remote_args(req, cluster)]
    if req.dry_run:
        return show(shell, tree, args)
    code, run_dir, out, err = land(shell, shell.python(args))
    if code == land_codes.PUSH:  # the cluster lacks the tree: push it, then land again
        where, sent = push.send(shell, tree, out.strip())
        print(f"pushed {sent} bytes of code to {cluster.name}:{where}", file=sys.stderr)
        code, run_dir, out, err = land(shell, shell.python(args))
    fix = shell.shown(f"{cluster.python} -m pip install hpc=={hpc.__version__}")
    if code == land_codes.OTHER_HPC:
        raise RemoteError(f"cluster {cluster.name} runs hpc {out.strip()} ({cluster.python}); expected "
                          f"{hpc.__version__}, this machine's: a run never mixes two versions of hpc. HINT: {fix}")
    if code and not run_dir:
        raise RemoteError(f"hpc is not importable by {cluster.python} on cluster {cluster.name} "
                          f"({last_line(err) or 'no answer'}); expected hpc {hpc.__version__}. HINT: {fix}, or set "
                          f"python: of {cluster.name} in clusters.yaml to an interpreter that has it")
    if code:
        sys.stderr.write(err[:len(err.rstrip()) - len(last_line(err))])
        raise RemoteError(f"python -m hpc.submit on cluster {cluster.name} exited with {code}: "
                          f"{last_line(err).removeprefix('error: ') or 'no message'}")
    sys.stderr.write(err)
    return Submitted(Path(run_dir), KIND, {})


def land(shell: Shell, command: str) -> Tuple[int, str, str, str]:
    """One call of hpc.remote.land: (exit status, the run dir there or '', its output when it named
    no run dir, its stderr). Once it names the run dir, its output (hpc.submit's) passes through."""
    argv = shell.argv(command)
    ssh.ROUND_TRIPS[0] += 1
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=shell.cwd())
    assert proc.stdout is not None and proc.stderr is not None
    first, run_dir, rest = proc.stdout.readline(), "", b""
    if first.startswith(b"@run-dir "):
        run_dir = first.decode().split(" ", 1)[1].strip()
        print(f"run dir: {shell.cluster.name}:{run_dir}", flush=True)
        for line in proc.stdout:
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()
    else:
        rest = first + proc.stdout.read()
    err = proc.stderr.read()
    done = subprocess.CompletedProcess(argv, proc.wait(), rest, err)
    try:
        shell.check(done, "submitting")
    except RemoteError as lost:
        if not run_dir:
            raise
        address = f"{shell.cluster.name}:{run_dir}"
        raise RemoteError(f"{lost}; the submission may have reached the cluster: python -m hpc.status {address} "
                          f"shows it, and the same command with --run-dir {run_dir} submits only what is not "
                          "queued") from None
    return done.returncode, run_dir, rest.decode(errors="replace"), err.decode(errors="replace")


def show(shell: Shell, tree: push.Tree, args: List[str]) -> Submitted:
    """--dry-run: the ssh commands a submission would run, without connecting."""
    c = shell.cluster
    print(f"cluster {c.name}: {len(tree.files)} files of {tree.root} as tree {tree.tree}; would run, over one "
          "connection:")
    print("  " + shell.shown(shell.python(args)))
    print(f"  # when {c.runs}/.hpc-code lacks the tree (exit {land_codes.PUSH}): the files it lacks, then the line above")
    print("  " + shell.shown(shell.python(["-m", "hpc.remote.store", "put", push.store_of(c.runs)])))
    return Submitted(Path(args[7]), KIND, {})
