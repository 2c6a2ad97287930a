"""The files of a code tree: which are code, their digests, and whether a live tree is as a listing says.

    python -c "from pathlib import Path; from hpc.rundir.codefiles import Source, listing; print(len(listing(Source(Path.cwd(), True))[0]))"

Which files: those `git ls-files -co --exclude-standard` names in a checkout (tracked files as they
are on disk, untracked files .gitignore does not exclude); without git, the directory's files,
hidden and virtualenv directories left out. Either way, hpc's own run and sweep directories inside
the tree (their manifest.json or sweep.json: hpc.rundir.sweepdir.made_by_hpc) are left out, with
their checkpoints and logs, and so are the snapshot stores of run roots inside it (.hpc-snapshots:
hpc.rundir.snapcache); a tree that is a run or sweep directory itself is refused. Untracked files over
UNTRACKED_MAX_BYTES are data, not code: left out and named. More than MAX_FILES files is not a code
tree: refused. A listing keeps each file's size, mtime, ctime and inode, and when it was made
(listed_ns), so a comparison reads and hashes only the files whose stat changed, or that were
modified within RACY_NS before the listing (git's own shortcut for a clean file, and its guard for
racy ones). Used by the snapshot (hpc.rundir.snapshot) and its cache.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from hpc import Record
from hpc.fs.filestamp import RACY_NS  # a file modified this close before its listing is racy
from hpc.rundir.run import MANIFEST
from hpc.rundir.snapcache import STORE
from hpc.rundir.sweepdir import RECORD, made_by_hpc
from hpc.rundir.treecopy import digest

UNTRACKED_MAX_BYTES = 2 << 20  # an untracked (or, without git, any) file larger than this is data
MAX_FILES = 50_000  # more than this is not a code tree (a home directory, a dataset)
PRUNE = frozenset({"__pycache__", "node_modules"})  # never code, walked without git
HINT = ("HINT: add what is not code to .gitignore, raise run.snapshot_max_mb, or pass --no-snapshot "
        "(the jobs then import the live tree)")



class SnapshotError(RuntimeError):
    """The code cannot be snapshotted as it is: what was seen, the limit, and a HINT."""


@dataclass(eq=False, repr=False)
class Source(Record):
    """The live tree a snapshot copies: a git checkout's top level, or a directory without git."""

    root: Path
    git: bool
    exclude: Tuple[str, ...] = ()  # absolute paths never copied (the run directory, the runs root)


def source_of(code_dir: Optional[str], cwd: Path, exclude: Sequence[Path] = ()) -> Source:
    """The tree to copy: the checkout code_version() found (hpc.rundir.codeversion), else the working directory."""
    root, git = (Path(code_dir), True) if code_dir else (Path(cwd), False)
    return Source(root.resolve(), git, tuple(str(Path(p).resolve()) for p in exclude))


def import_root(module_file: Optional[str], module: str) -> Optional[Path]:
    """The sys.path entry a module was found under: /repo/src for /repo/src/pkg/mod.py as pkg.mod."""
    if not module_file:
        return None
    path = Path(module_file).resolve()
    depth = len(module.split(".")) - (0 if path.name == "__init__.py" else 1)
    return path.parents[depth] if depth < len(path.parents) else None


def listing(source: Source) -> Tuple[Dict[str, os.stat_result], List[str]]:
    """(relative path -> lstat of each file to copy, untracked files left out as too big)."""
    root = str(source.root)  # joined as a string: a Path per file costs more than its lstat
    if made_by_hpc(root):
        raise SnapshotError(f"{root} is a run or sweep directory of hpc (its {MANIFEST} or {RECORD}); expected a "
                            "code tree. HINT: submit from your project's directory, or pass --no-snapshot.")
    entries = git_files(source.root) if source.git else walk(source.root)
    # strictly inside: a run root that is the checkout itself (run.root=.) leaves the run dirs in it
    excluded = {os.path.relpath(p, root) for p in source.exclude if source.root in Path(p).parents}
    if source.git:  # walk() leaves them out itself
        excluded |= hpc_dirs(root, entries)
    files: Dict[str, os.stat_result] = {}
    skipped: List[str] = []
    base = root.rstrip("/") + "/"  # joined by hand: git's and walk()'s paths are relative
    store = f"/{STORE}/"
    for rel, tracked in entries:
        if (excluded and under(rel, excluded)) or store in "/" + rel:  # a run root's snapshots: not code
            continue
        try:
            st = os.lstat(base + rel)
        except OSError:  # tracked but deleted in the working tree: an uncommitted deletion
            continue
        if not (stat.S_ISREG(st.st_mode) or is_link(st)):  # a submodule's directory, a socket
            continue
        if not tracked and st.st_size > UNTRACKED_MAX_BYTES:
            skipped.append(rel)
            continue
        files[rel] = st
        if len(files) > MAX_FILES:
            raise SnapshotError(f"{source.root} holds more than {MAX_FILES} files to snapshot; expected a code "
                                f"tree. {HINT}.")
    return files, sorted(skipped)


GIT_FILES = ["git", "ls-files", "-z", "-t", "-co", "--exclude-standard"]  # tracked and untracked, not ignored


def git_files(root: Path) -> List[Tuple[str, bool]]:
    """(path, tracked) for what `git ls-files -co --exclude-standard` names; -t tags untracked '?'."""
    try:
        out = subprocess.run(GIT_FILES, cwd=root,
                             capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SnapshotError(f"git ls-files in {root} failed ({err}); expected a git checkout. {HINT}.") from None
    if out.returncode:
        raise SnapshotError(f"git ls-files in {root} exited {out.returncode}: "
                            f"{out.stderr.decode(errors='replace').strip()}. {HINT}.")
    entries = {}
    for item in out.stdout.decode(errors="surrogateescape").split("\0"):
        if item:
            tag, rel = item[:1], item[2:]
            entries[rel] = entries.get(rel, False) or tag != "?"  # a merge conflict lists a path twice
    return list(entries.items())


def under(rel: str, dirs: Set[str]) -> bool:
    """Whether the relative path `rel` lies inside one of `dirs` (relative directories)."""
    cut = rel.find("/")
    while cut != -1:
        if rel[:cut] in dirs:
            return True
        cut = rel.find("/", cut + 1)
    return False


def hpc_dirs(root: str, entries: List[Tuple[str, bool]]) -> Set[str]:
    """The directories of a checkout's entries that are hpc's run or sweep directories
    (made_by_hpc), outermost only: those that list a marker, and every directory above an untracked
    file, read on disk (.gitignore may hide a run's manifest.json and not its checkpoints). A
    directory of tracked files alone is not opened: the cost is one failed open per marker and
    directory checked, and a checkout has few untracked files."""
    dirs: Set[str] = set()
    for rel, tracked in entries:
        cut = rel.rfind("/")
        if tracked and rel[cut + 1:] not in (MANIFEST, RECORD):
            continue
        while cut > 0 and rel[:cut] not in dirs:
            dirs.add(rel[:cut])
            cut = rel.rfind("/", 0, cut)
    found: Set[str] = set()
    for rel in sorted(dirs):  # a directory after its parents
        if not under(rel, found) and made_by_hpc(os.path.join(root, rel)):
            found.add(rel)
    return found


def walk(root: Path) -> List[Tuple[str, bool]]:
    """Every file under a directory without git, hidden and virtualenv directories and hpc's run and
    sweep directories left out."""
    found: List[Tuple[str, bool]] = []
    for here, dirs, names in os.walk(root):
        if (MANIFEST in names or RECORD in names) and made_by_hpc(here):
            dirs[:] = []  # an earlier run inside the tree: its checkpoints and logs are not code
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in PRUNE
                         and not os.path.exists(os.path.join(here, d, "pyvenv.cfg")))
        base = os.path.relpath(here, root)
        found += [(n if base == "." else f"{base}/{n}", False) for n in sorted(names) if not n.startswith(".")]
        if len(found) > MAX_FILES:
            raise SnapshotError(f"{root} is not a git checkout and holds more than {MAX_FILES} files; expected "
                                f"a code tree. HINT: submit from your project's directory, make it a git "
                                "repository, or pass --no-snapshot.")
    return found


def is_link(st: os.stat_result) -> bool:
    return stat.S_ISLNK(st.st_mode)


def load_table(path: Path) -> Optional[Dict[str, Any]]:
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return table if isinstance(table, dict) and isinstance(table.get("files"), dict) else None


def clean(entry: Sequence[Any], st: os.stat_result, listed_ns: int) -> bool:
    """Whether a file is as a listing's `entry` says by its stat alone, as git trusts a clean index
    entry: the same size, mtime, ctime and inode, and an mtime older than the listing by more than
    RACY_NS. An edit within the timestamp tick of the listing (or an mtime put back by os.utime)
    keeps size and mtime; the ctime catches the latter, and a racy file is read and hashed."""
    return (len(entry) >= 6 and (entry[0], entry[1], entry[4], entry[5]) == (
        st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) and st.st_mtime_ns < listed_ns - RACY_NS)


def same_stat(entry: Sequence[Any], st: os.stat_result) -> bool:
    """The listed size and mtime, and the ctime and inode where the listing has them."""
    return (entry[0], entry[1]) == (st.st_size, st.st_mtime_ns) and (
        len(entry) < 6 or (entry[4], entry[5]) == (st.st_ctime_ns, st.st_ino))


def content(root: Path, rel: str, st: os.stat_result) -> str:
    """The digest of a live file (a symlink: of its target)."""
    path = os.path.join(root, rel)
    return digest(os.fsencode(os.readlink(path)), True) if is_link(st) else digest(Path(path).read_bytes())


def unchanged(table: Mapping[str, Any], files: Mapping[str, os.stat_result]) -> bool:
    """The same paths, each clean by its stat, or with the same stat and, being racy, the same
    content read again. A listing without its time and ctimes (made before they were kept) is
    never trusted: one copy."""
    listed, listed_ns = table["files"], table.get("listed_ns")
    if listed.keys() != files.keys() or not isinstance(listed_ns, int):
        return False
    for rel, st in files.items():
        entry = listed[rel]
        if clean(entry, st, listed_ns):
            continue
        if len(entry) < 6 or not same_stat(entry, st):
            return False
        try:
            if content(Path(table["root"]), rel, st) != entry[2]:
                return False
        except OSError:  # gone since it was listed
            return False
    return True
