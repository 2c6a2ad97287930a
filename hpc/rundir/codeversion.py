"""Which code a submission ran: the git commit and checkout of the user's code, and hpc's version.

    python -c "from hpc.rundir.codeversion import code_version; print(code_version(None))"

The manifest (hpc.rundir.run) records what code_version() returns with each submission, and the
code snapshot (hpc.rundir.codefiles) copies the checkout it found.

The commit and the checkout's root are what `git rev-parse HEAD --show-toplevel` prints, read from
the files git keeps (the `.git` directory or a worktree's `.git` file, HEAD, the loose ref or
packed-refs): a submission runs no git process for them. Whatever that reading does not cover
exactly as git would asks git itself: one of git's GIT_SETTINGS in the environment, a checkout owned by
another user (git's safe.directory check), a ref it cannot resolve (an unborn branch, the reftable
format), a `.git` it cannot read, a search for `.git` that would cross into another file system.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from hpc import __version__

GIT_HEAD = ["git", "rev-parse", "HEAD", "--show-toplevel"]  # the commit, then the checkout's root
_HEX = frozenset("0123456789abcdef")
_ASK_GIT = object()  # the files do not say it as git would: run git
# git's variables that change where it looks or what it resolves: when one is set, git decides
GIT_SETTINGS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_CEILING_DIRECTORIES", "GIT_NAMESPACE",
                "GIT_DISCOVERY_ACROSS_FILESYSTEM", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT")


def code_version(module_file: Optional[str], cwd: Optional[Path] = None) -> Dict[str, Any]:
    """What the manifest records about the submitted code: the git commit of the user's code and
    hpc's version beside it. The user's code is the checkout of `module_file` (the pipeline's module;
    None for pipelines that ship with hpc), else that of the working directory, where a `run`
    pipeline's script lives."""
    places = [Path(module_file).resolve().parent] if module_file else []
    places.append(Path(cwd or os.getcwd()))
    commit = root = None
    for place in places:
        commit, root = git_head(place)
        if commit:
            break
    return {"git_commit": commit, "code_dir": root, "hpc_version": hpc_version()}


def git_head(place: Path) -> Tuple[Optional[str], Optional[str]]:
    """(commit, checkout root) of the git checkout holding `place`; (None, None) outside one."""
    found = _read_head(place)
    return _ask_git(place) if found is _ASK_GIT else found  # type: ignore[return-value]


def _ask_git(place: Path) -> Tuple[Optional[str], Optional[str]]:
    try:
        out = subprocess.run(GIT_HEAD, cwd=place,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    lines = out.stdout.split("\n")
    return (lines[0], lines[1]) if out.returncode == 0 and len(lines) > 1 else (None, None)


def _read_head(place: Path) -> Any:
    """git rev-parse's answer read from git's files, (None, None) outside a checkout, or _ASK_GIT."""
    if any(k in os.environ for k in GIT_SETTINGS):
        return _ASK_GIT
    top = os.path.realpath(place)
    if ".git" in top.split(os.sep):  # inside a git directory: no work tree there
        return _ASK_GIT
    try:
        device = os.stat(top).st_dev
    except OSError:
        return _ASK_GIT
    while True:
        dot = os.path.join(top, ".git")
        try:
            st = os.stat(dot)
            break
        except OSError:
            parent = os.path.dirname(top)
            if parent == top:
                return None, None
            top = parent
            try:
                if os.stat(top).st_dev != device:  # git stops at a file system's boundary
                    return _ASK_GIT
            except OSError:
                return _ASK_GIT
    try:
        git_dir = dot if os.path.isdir(dot) else _linked_dir(dot)
        if git_dir is None or st.st_uid != os.getuid() or os.stat(top).st_uid != os.getuid():
            return _ASK_GIT  # not a plain layout, or another user's checkout (safe.directory)
        commit = _resolve(git_dir, _first_line(os.path.join(git_dir, "HEAD")))
    except (OSError, UnicodeDecodeError):
        return _ASK_GIT
    return (commit, top) if commit else _ASK_GIT


def _linked_dir(dot_file: str) -> Optional[str]:
    """The git directory a `.git` file names (a worktree, a submodule): `gitdir: <path>`."""
    line = _first_line(dot_file)
    if not line.startswith("gitdir: "):
        return None
    return os.path.normpath(os.path.join(os.path.dirname(dot_file), line[len("gitdir: "):]))


def _resolve(git_dir: str, head: str) -> Optional[str]:
    """The object id HEAD names: itself when detached, else its ref's, loose or packed (symbolic
    refs followed a few levels, as git does); None when it cannot be read here."""
    common = git_dir
    if os.path.exists(os.path.join(git_dir, "commondir")):  # a linked worktree: branches live in the main one
        common = os.path.normpath(os.path.join(git_dir, _first_line(os.path.join(git_dir, "commondir"))))
    for _ in range(5):
        if _is_object_id(head):
            return head
        if not head.startswith("ref: refs/"):
            return None
        ref = head[len("ref: "):]
        own = git_dir if ref.startswith(("refs/worktree/", "refs/bisect/")) else common
        try:
            head = _first_line(os.path.join(own, ref))
        except (FileNotFoundError, NotADirectoryError):
            return _packed(common, ref)
    return None


def _packed(common: str, ref: str) -> Optional[str]:
    try:
        with open(os.path.join(common, "packed-refs"), encoding="utf-8") as fh:
            for line in fh:
                oid, _, name = line.rstrip("\n").partition(" ")
                if name == ref and _is_object_id(oid):
                    return oid
    except FileNotFoundError:
        pass
    return None


def _is_object_id(text: str) -> bool:
    """An object id as git writes it: SHA-1, or SHA-256 in a sha256 repository (no regex: one less
    compiled at import)."""
    return len(text) in (40, 64) and set(text) <= _HEX


def _first_line(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.readline().strip()


def hpc_version() -> str:
    # hpc.__version__, the one pyproject.toml also states: importlib.metadata would scan every
    # installed distribution, a cost of the same order as importing submitit, on every submission.
    return __version__
