"""The installed packages' bytecode, linked into the tests' bytecode cache (PYTHONPYCACHEPREFIX).

    seed_pycache("/tmp/hpc-tests-pycache-0")     # tests/conftest.py, once per run, in the controller

Under a cache prefix Python reads bytecode only from the prefix's mirror of each source folder, so
the .pyc files an installer wrote beside the sources (torch, Lightning, the standard library) are
never read, and each module is compiled again the first time a process imports it. A hard link
per file puts them where the prefix expects them, for the price of a link: the file's header still
names its source's size and time, so a changed source is compiled as usual, and Python replaces a
stale file by renaming a new one over it, which leaves the installed file alone.
"""

from __future__ import annotations

import errno
import os
import sys
import sysconfig

MARK = ".seeded"  # in the prefix, per interpreter: the folders seeded, one per line


def seed_pycache(prefix: str) -> int:
    """Link the bytecode of the standard library and the installed packages into `prefix`; the
    number of files linked. Each folder once per prefix; a folder whose files cannot be linked there
    (another file system, or links to files of another user refused) is left to be compiled into it
    as its modules are imported."""
    tag = sys.implementation.cache_tag
    folders = sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
    mark = os.path.join(prefix, f"{MARK}-{tag}")
    try:
        with open(mark) as fh:
            done = set(fh.read().split("\n"))
    except OSError:
        done = set()
    linked = 0
    for folder in folders:
        if folder in done or not os.path.isdir(folder):
            continue
        count = _link_tree(folder, prefix, f".{tag}")
        if count is None:
            continue
        linked += count
        os.makedirs(prefix, exist_ok=True)
        with open(mark, "a") as fh:
            fh.write(folder + "\n")
    return linked


def _link_tree(folder: str, prefix: str, tag: str) -> int | None:
    """Link every __pycache__/*<tag>*.pyc under `folder` to its place in `prefix`; None at the first
    link refused for good (EXDEV, EPERM)."""
    count = 0
    for root, dirs, files in os.walk(folder):
        if os.path.basename(root) != "__pycache__":
            dirs[:] = [d for d in dirs if d != "site-packages" or root != folder]  # its own walk
            continue
        target = os.path.join(prefix, os.path.dirname(root).lstrip(os.sep))
        for name in files:
            if tag not in name or not name.endswith(".pyc"):
                continue
            try:
                _link(os.path.join(root, name), os.path.join(target, name))
                count += 1
            except FileExistsError:
                pass
            except OSError as err:
                if err.errno in (errno.EXDEV, errno.EPERM):
                    return None
    return count


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except FileNotFoundError:  # the mirror folder, made at its first file
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.link(source, target)
