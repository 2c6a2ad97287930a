"""The laptop's side of a push: the code tree, its digests, and what travels to the cluster.

    python -c "from pathlib import Path; from hpc.remote import push; print(push.local_tree(Path.cwd()).tree)"

The tree is what a snapshot would copy (hpc.rundir.codefiles.listing: a checkout's files as git
names them, else the directory's), each file by its digest; the tree hash covers every path, digest
and mode. A submission names the tree by its hash (hpc.remote.land); only when the cluster does not
hold it, send() runs hpc.remote.store put there, in one ssh call, and sends the files whose digests
the store lacks. An unchanged tree sends its hash and nothing else.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from hpc.remote import ssh
from hpc.remote.ssh import RemoteError, Shell, last_line
from hpc.rundir import codefiles


@dataclass(frozen=True)
class Tree:
    root: Path
    files: Tuple[Tuple[str, str, int], ...]  # (path, digest, st_mode), sorted by path
    tree: str  # the hash of all of them

    def header(self) -> bytes:
        return json.dumps({"tree": self.tree, "files": [list(f) for f in self.files]}).encode() + b"\n"


def store_of(runs: str) -> str:
    return os.path.join(runs, ".hpc-code")


def source_root(cwd: Path) -> Path:
    """The tree to push: the git checkout around `cwd`, else `cwd` itself."""
    if not shutil.which("git"):
        return cwd
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True)
    return Path(top.stdout.strip()) if top.returncode == 0 and top.stdout.strip() else cwd


def local_tree(cwd: Path) -> Tree:
    root = source_root(cwd.resolve()).resolve()
    git = (root / ".git").exists() and bool(shutil.which("git"))
    stats, _ = codefiles.listing(codefiles.Source(root, git))
    files = tuple(sorted((rel, codefiles.content(root, rel, st), mode(st)) for rel, st in stats.items()))
    h = hashlib.sha256(json.dumps(files).encode()).hexdigest()[:32]
    return Tree(root, files, h)


def mode(st: os.stat_result) -> int:
    """What a tree keeps of a file's mode: a symlink, or a file executable or not."""
    return stat.S_IFLNK | 0o777 if stat.S_ISLNK(st.st_mode) else stat.S_IFREG | (0o755 if st.st_mode & 0o111 else 0o644)


def send(shell: Shell, tree: Tree, runs: str) -> Tuple[str, int]:
    """(the tree's path there, bytes of file content sent): the files the cluster lacks, in one call,
    into the store under `runs` (absolute there)."""
    command = shell.python(["-m", "hpc.remote.store", "put", store_of(runs)])
    shell_argv = shell.argv(command)
    ssh.ROUND_TRIPS[0] += 1
    proc = subprocess.Popen(shell_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=shell.cwd())
    sent = 0
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(tree.header())
        proc.stdin.flush()
        lacking: List[str] = json.loads(proc.stdout.readline() or b"[]")
        paths: Dict[str, str] = {d: rel for rel, d, _ in tree.files}
        for digest in lacking:
            data = read(tree.root, paths[digest])
            proc.stdin.write(f"{len(data)}\n".encode() + data)
            sent += len(data)
        proc.stdin.close()
    except (BrokenPipeError, ValueError):
        pass  # the other side ended: its exit status and stderr say why, below
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    done = subprocess.CompletedProcess(shell_argv, proc.wait(), out, err)
    shell.check(done, "pushing the code")
    where = out.decode(errors="replace").strip().splitlines()
    if done.returncode or not where:
        said = last_line(err.decode(errors="replace")).removeprefix("error: ")
        raise RemoteError(f"pushing the code to cluster {shell.cluster.name} failed: {said or 'no answer'}")
    return where[-1], sent


def read(root: Path, rel: str) -> bytes:
    """A file's bytes as the store keeps them: a symlink's target."""
    path = os.path.join(root, rel)
    return os.fsencode(os.readlink(path)) if os.path.islink(path) else Path(path).read_bytes()
