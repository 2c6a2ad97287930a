"""A copy of the user's code, taken at submission: every job of the run imports from it.

    python -m hpc.submit mypkg.pipeline --run-dir runs/a  # copies the code into runs/.hpc-snapshots/<hash>/
    python -m hpc.submit mypkg.pipeline --no-snapshot     # the jobs run the live tree instead

What is copied: the files `git ls-files -co --exclude-standard` names in the checkout of the
pipeline's module, else in that of the working directory (tracked files as they are on disk, so with
their uncommitted changes, and untracked files that .gitignore does not exclude); without git, the
working directory's files, hidden and virtualenv directories left out. Untracked files over
UNTRACKED_MAX_BYTES are data, not code: they are left out and named. Run directories and snapshot
stores are never copied. A snapshot over `max_mb` in all, or with more than MAX_FILES files, is refused
before anything is submitted; an empty tree (a submission from an empty directory) is an empty snapshot.

Where: in the store of the run directory's root, its parent (hpc.rundir.snapcache):
<root>/.hpc-snapshots/<hash>/, content-addressed, and <hash>.json beside it, which lists each file's
size, mtime, ctime, inode and digest, and when the listing was made. The run's manifest names the
snapshot its jobs run; the run directory holds no copy. Files are copied, never hard-linked to the
live tree: an editor that saves in place would change a linked copy (a store may link to another
root's snapshot of the same files). The copy is made in <store>/.tmp-<host>-<pid>-<random>/ and
renamed whole (hpc.rundir.treecopy): a submission killed midway leaves that folder, never a half copy
under a hash, and the next snapshot into the same store removes it. A submission whose files all
still have the stat the newest snapshot of the tree listed runs that snapshot without reading them,
except the files modified within a timestamp tick of the listing, which are read and hashed
(hpc.rundir.codefiles.clean: git's guard for racy entries); hpc.status compares the live tree with the
listing the same way. `--same-snapshot` (recorded()) runs a manifest's snapshot again whatever the
live tree holds: hpc's own resubmissions do. A sweep's points all run the snapshot taken for the sweep.

In the job (JobCode.enter): the snapshot's copy of the submission directory becomes the working
directory, and the snapshot's copies of the pipeline's import root and of the submission directory
come first on sys.path and PYTHONPATH. HPC_SUBMIT_DIR names the live submission directory, for data
paths relative to it; HPC_CODE_DIR names the snapshot. Runs of one root whose code did not change
share one snapshot, as a sweep's points do: a stage that writes into its working directory writes
into that shared copy (write under the run directory instead). No torch here: submission and status
stay fast.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from hpc import Frozen
from hpc.fs import atomic
from hpc.rundir import snapcache, treecopy
from hpc.rundir.codefiles import HINT, UNTRACKED_MAX_BYTES, SnapshotError, Source, listing, load_table, unchanged

Stat = Tuple[int, int, str, int, int, int]  # (size, mtime_ns, digest, mode, ctime_ns, inode) of one file


# never compared or printed: no generated __repr__ or __eq__ (a submission imports this module)
@dataclass(repr=False, eq=False)
class JobCode(Frozen):
    """What a task needs to run the snapshot (pickled with each StageTask: paths only)."""

    dir: str  # <root>/.hpc-snapshots/<hash> (hpc.rundir.snapcache)
    hash: str
    submit_dir: str  # the live working directory of the submission
    cwd: Optional[str]  # the snapshot's copy of it; None when it is not in the snapshot
    path: Tuple[str, ...]  # put first on sys.path and PYTHONPATH

    def environ(self, environ: Mapping[str, str]) -> Dict[str, str]:
        """The variables a task exports: child processes (the `run` pipeline's script, external
        scripts) import from the snapshot too."""
        given = [self._in_snapshot(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        pythonpath = [*self.path, *[p for p in given if p]]
        return {"HPC_CODE_DIR": self.dir, "HPC_SUBMIT_DIR": self.submit_dir,
                "PYTHONPATH": os.pathsep.join(dict.fromkeys(pythonpath))}

    def _in_snapshot(self, entry: str) -> Optional[str]:
        """A PYTHONPATH entry of the submitting shell, with the live submit directory's part mapped
        to the snapshot's copy (None: in the live tree, but not in the snapshot)."""
        live = os.path.realpath(self.submit_dir)
        real = os.path.realpath(entry)
        if not os.path.isabs(entry) or (real != live and not real.startswith(live + os.sep)):
            return entry  # relative (to the working directory), or outside the live tree
        if not self.cwd:
            return None
        mapped = os.path.join(self.cwd, os.path.relpath(real, live))
        return mapped if os.path.isdir(mapped) else None

    def enter(self) -> None:
        """Run from the snapshot in this process. Modules imported before (hpc itself, which
        unpickled this task) stay as they are; the pipeline's own are imported after this."""
        if not os.path.isdir(self.dir):
            raise SnapshotError(f"the code snapshot {self.dir} this job runs is gone; expected the copy taken at "
                                "submission. HINT: resubmit with --run-dir (that takes a new snapshot), or with "
                                "--no-snapshot.")
        if self.cwd:
            os.chdir(self.cwd)
        # The job's interpreter started in the live submit directory (`python -m` puts it first on
        # sys.path): a module the snapshot left out, or one added or edited after submission, would
        # be imported from there. Only the snapshot is importable.
        live = {self.submit_dir, os.path.realpath(self.submit_dir), ""}
        sys.path[:] = [p for p in sys.path if p not in live and os.path.realpath(p or ".") not in live]
        sys.path[:0] = [p for p in self.path if p not in sys.path[:len(self.path)]]
        importlib.invalidate_caches()


class Snapshot:
    """A snapshot taken, reused or linked: what the manifest records and where the jobs run. A plain
    class, not a dataclass: a submission makes one, and a dataclass's generated methods cost more
    to create when the module is imported (about 0.5 ms) than this class is ever used."""

    __slots__ = ("source", "hash", "dir", "files", "bytes", "seconds", "reused", "skipped", "linked")

    def __init__(self, source: Source, hash: str, dir: Path, files: int, bytes: int, seconds: float,
                 reused: bool, skipped: Tuple[str, ...], linked: bool = False):
        self.source, self.hash, self.dir, self.files, self.bytes = source, hash, dir, files, bytes
        self.seconds = seconds
        self.reused = reused  # an earlier submission's snapshot of the same files
        self.skipped = skipped  # untracked files left out as data (relative paths)
        self.linked = linked  # hard links to an earlier run's snapshot of the same files (hpc.rundir.snapcache)

    def __repr__(self) -> str:
        return f"Snapshot({self.hash}, {self.dir}, {self.files} files)"

    def record(self) -> Dict[str, Any]:
        """What the manifest keeps (hpc.status reads the listing beside the copy)."""
        return {"hash": self.hash, "dir": str(self.dir), "root": str(self.source.root), "git": self.source.git,
                "files": self.files, "bytes": self.bytes, "seconds": round(self.seconds, 4),
                "reused": self.reused, "skipped": list(self.skipped)}

    def summary(self) -> str:
        how = ("reused (no file changed)" if self.reused else
               "linked to an earlier run's snapshot (no file changed)" if self.linked else "copied")
        text = (f"code: {self.source.root} ({'git checkout' if self.source.git else 'no git'}) -> {self.dir}, "
                f"{self.files} files, {self.bytes / 1e6:.1f} MB, {how} in {self.seconds * 1000:.0f} ms")
        if self.skipped:
            text += (f"; left out {len(self.skipped)} untracked file(s) over {UNTRACKED_MAX_BYTES >> 20} MB: "
                     f"{', '.join(self.skipped[:3])}{' ...' if len(self.skipped) > 3 else ''}")
        return text

    def job_code(self, submit_dir: Path, import_root: Optional[Path] = None) -> JobCode:
        """Where a task runs and imports from: the snapshot's copies of the submission directory
        and of the pipeline's import root (a src/ layout, a package beside the tests) when those lie
        in the copied tree. Elsewhere the job keeps the live directory."""
        def inside(place: Optional[Path]) -> Optional[str]:
            if place is None:
                return None
            try:
                rel = Path(place).resolve().relative_to(self.source.root)
            except ValueError:
                return None
            mapped = self.dir / rel
            return str(mapped) if mapped.is_dir() else None

        cwd = inside(submit_dir)
        path = tuple(dict.fromkeys(p for p in (inside(import_root), cwd) if p))
        return JobCode(str(self.dir), self.hash, str(Path(submit_dir).resolve()), cwd, path)


# ------------------------------------------------------------------------------------ taking one
def take(source: Source, run_path: Path, max_mb: float, previous: Optional[str] = None) -> Snapshot:
    """Copy the code into the store of the run directory's root (<root>/.hpc-snapshots/<hash>/,
    hpc.rundir.snapcache), or run a snapshot of the same files that is there: `previous` (a hash),
    else the newest of this tree; the newest in another root's store is hard-linked into this one."""
    started = time.perf_counter()
    listed_ns = time.time_ns()  # before any stat: a file modified after this is racy (codefiles.clean)
    files, skipped = listing(source)
    total = sum(st.st_size for st in files.values())
    if total > max_mb * 1e6:
        raise SnapshotError(f"the snapshot of {source.root} would be {total / 1e6:.0f} MB in {len(files)} files, "
                            f"over run.snapshot_max_mb={max_mb:g}; the largest directories: "
                            f"{_largest(files)}. {HINT}.")
    store = snapcache.store_of(run_path)
    table = load_table(store / f"{previous}.json") if previous else None
    found = (store / str(previous), table) if table else snapcache.newest(source.root, store)
    if found is not None and not unchanged(found[1], files):
        found = None
    if found is not None and (store / found[0].name).is_dir():  # named by content: the same files
        return Snapshot(source, found[0].name, store / found[0].name, len(files), total,
                        time.perf_counter() - started, True, tuple(skipped))

    def fill(tmp: Path) -> Tuple[Dict[str, Stat], bool]:
        linked = snapcache.link(found[0], found[1], tmp, files) if found is not None else None
        return (linked, True) if linked is not None else (_copy(source.root, tmp, files), False)

    # a temporary copy renamed whole (hpc.rundir.treecopy): an empty tree is an empty snapshot, and
    # a copy killed midway is removed by the next snapshot taken in this store
    final, (stats, linked), _ = treecopy.make(store, fill, lambda made: tree_hash(made[0]))
    table = {"hash": final.name, "root": str(source.root), "git": source.git, "exclude": list(source.exclude),
             "listed_ns": listed_ns, "files": stats}
    atomic.write_text(store / f"{final.name}.json", json.dumps(table, separators=(",", ":")))
    snapcache.remember(source.root, final)
    return Snapshot(source, final.name, final, len(files), total, time.perf_counter() - started, False,
                    tuple(skipped), linked)


def _copy(root: Path, dest: Path, files: Mapping[str, os.stat_result]) -> Dict[str, Stat]:
    """Copy each file (hpc.rundir.treecopy.copy_files); the stat kept is the one taken before the
    read, so a file changed meanwhile shows as changed later."""
    digests = treecopy.copy_files(dest, {rel: (os.path.join(root, rel), st.st_mode) for rel, st in files.items()})
    return {rel: (st.st_size, st.st_mtime_ns, digests[rel], 0o755 if st.st_mode & 0o111 else 0o644,
                  st.st_ctime_ns, st.st_ino) for rel, st in files.items()}


def tree_hash(stats: Mapping[str, Stat]) -> str:
    """The snapshot's name: a digest of every path, content digest and executable bit."""
    lines = "".join(f"{rel}\0{stats[rel][2]}\0{stats[rel][3]:o}\n" for rel in sorted(stats))
    return hashlib.sha256(lines.encode(errors="surrogateescape")).hexdigest()[:16]  # one update: the same digest


def _largest(files: Mapping[str, os.stat_result], n: int = 3) -> str:
    sizes: Dict[str, int] = {}
    for rel, st in files.items():
        top = rel.split("/")[0] if "/" in rel else "."
        sizes[top] = sizes.get(top, 0) + st.st_size
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name}/ {size / 1e6:.0f} MB" for name, size in ranked)


def recorded(record: Mapping[str, Any]) -> Optional[Snapshot]:
    """The snapshot a manifest records, to run again as it is (None when its copy is gone)."""
    if not record or not Path(record["dir"]).is_dir():
        return None
    return Snapshot(Source(Path(record["root"]), bool(record["git"])), record["hash"], Path(record["dir"]),
                    record["files"], record["bytes"], 0.0, True, tuple(record.get("skipped", ())))


def status_line(record: Optional[Mapping[str, Any]]) -> str:
    """hpc.status's line about the code (hpc.rundir.codedrift.status_line)."""
    from hpc.rundir import codedrift  # only hpc.status compares the live tree: a submission never loads it

    return codedrift.status_line(record)
