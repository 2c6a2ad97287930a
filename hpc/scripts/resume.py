"""The resume contract for a script that resumes only when told, and only from a complete checkpoint.

    python -m hpc.submit run --resume-if 'out/ckpt.pt' --resume-args '--init_from=resume' -- python train.py
    python -m hpc.submit run --resume-if 'out/checkpoint-*' \\
        --resume-args '--resume_from_checkpoint $HPC_LAST_CHECKPOINT' -- python train.py --output_dir out

- Placeholders: $HPC_RUN_DIR, $HPC_WORK_DIR, $HPC_CHECKPOINT_DIR and $HPC_LAST_CHECKPOINT (also
  written ${...}) are expanded in every argument: the argv runs without a shell.
- Before each launch rank 0 looks for checkpoints matching the --resume-if pattern (relative to the
  working directory). Incomplete ones (hpc.checkpoint.complete) are set aside, moved, never deleted,
  to <task>/incomplete/, where python -m hpc.status names them. If a complete one is left, the newest
  (by the number its name ends in, then by time) is $HPC_LAST_CHECKPOINT and the --resume-args are
  added to the command; otherwise the script starts fresh, without them.
- A pattern with no wildcard names a file the script overwrites in place (nanoGPT's ckpt.pt): hpc
  keeps a copy of its last complete version in <task>/kept/ (plan_keep, then Keeper while the script
  runs), and puts it back when a kill during a save left the file incomplete. That costs one more
  copy of the checkpoint on disk, and one copy's I/O per save.
The plan is rank 0's, saved with the working directory's layout; every rank runs the same argv.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import threading
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from hpc.checkpoint.complete import SET_ASIDE, is_complete, step_of

PLACEHOLDERS = ("HPC_RUN_DIR", "HPC_WORK_DIR", "HPC_CHECKPOINT_DIR", "HPC_LAST_CHECKPOINT")
_PLACEHOLDER = re.compile(r"\$(?:\{(HPC_[A-Z_]+)\}|(HPC_[A-Z_]+))")
KEPT = "kept"  # <task>/kept/<name>


def unknown_placeholders(args: Sequence[str]) -> List[str]:
    return sorted({a or b for arg in args for a, b in _PLACEHOLDER.findall(arg)} - set(PLACEHOLDERS))


def expand(args: Sequence[str], values: Mapping[str, str]) -> List[str]:
    """Each $HPC_X / ${HPC_X} of PLACEHOLDERS replaced by values[X] ('' when it has none)."""
    def one(m: "re.Match[str]") -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, "") if name in PLACEHOLDERS else m.group(0)
    return [_PLACEHOLDER.sub(one, arg) for arg in args]


def is_pattern(text: str) -> bool:
    return glob.has_magic(text)


def matches(pattern: str, work: Path) -> List[Path]:
    """The pattern's matches under the working directory, newest last (name's number, then mtime)."""
    full = pattern if os.path.isabs(pattern) else str(work / pattern)
    found = [Path(p) for p in glob.glob(full, recursive=True)]

    def key(p: Path) -> tuple:
        try:
            mtime = p.stat().st_mtime_ns
        except OSError:
            mtime = 0
        return step_of(p), mtime
    return sorted(found, key=key)


def set_aside(path: Path, task_dir: Path, attempt: Mapping[str, str]) -> Path:
    """Move an incomplete checkpoint out of the pattern's reach, keeping it for a post-mortem."""
    dest = task_dir / SET_ASIDE / f"{path.name}.{attempt['job']}-{attempt['restart']}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        dest = dest.with_name(f"{dest.name}-{uuid.uuid4().hex[:6]}")
    os.replace(path, dest)
    return dest


def plan(pattern: str, work: Path, task_dir: Path, attempt: Mapping[str, str]) -> Dict[str, object]:
    """Rank 0, before a launch: {'last': newest complete match or None, 'set_aside': [[from, to, why]],
    'restored': the kept copy put back, or None}."""
    aside: List[List[str]] = []
    restored: Optional[str] = None
    if not is_pattern(pattern):
        restored = plan_keep(Path(pattern if os.path.isabs(pattern) else work / pattern), task_dir, attempt, aside)
    last = newest_complete(pattern, work, lambda path, why: aside.append(
        [str(path), str(set_aside(path, task_dir, attempt)), why]))
    return {"last": str(last) if last else None, "set_aside": aside, "restored": restored}


def newest_complete(pattern: str, work: Path,
                    put_aside: Optional[Callable[[Path, str], None]] = None) -> Optional[Path]:
    """The newest complete match of the pattern; each newer incomplete one is handed to
    `put_aside(path, why)` first (a link, not the script's own output, is left alone)."""
    for path in reversed(matches(pattern, work)):
        ok, why = is_complete(path)
        if ok:
            return path
        if put_aside is not None and not path.is_symlink():
            put_aside(path, why)
    return None


def plan_keep(path: Path, task_dir: Path, attempt: Mapping[str, str], aside: List[List[str]]) -> Optional[str]:
    """A checkpoint overwritten in place: keep its last complete version, or put that back."""
    kept = task_dir / KEPT / path.name
    if path.exists():
        ok, why = is_complete(path)
        if ok:
            keep(path, kept)
            return None
        aside.append([str(path), str(set_aside(path, task_dir, attempt)), why])
    if kept.exists() and is_complete(kept)[0]:
        _copy(kept, path)
        return str(kept)
    return None


def keep(path: Path, kept: Path) -> bool:
    """Copy path to kept unless kept already is that version (same size and mtime)."""
    try:
        st, old = path.stat(), kept.stat() if kept.exists() else None
    except OSError:
        return False
    if old is not None and (old.st_size, old.st_mtime_ns) == (st.st_size, st.st_mtime_ns):
        return False
    _copy(path, kept)
    return True


def _copy(src: Path, dst: Path) -> None:
    """A whole copy under a temporary name, then renamed: a reader never sees half of it."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
    if src.is_dir():
        shutil.copytree(src, tmp, copy_function=shutil.copy2)
        old = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.old")
        if dst.exists():
            os.replace(dst, old)
        os.replace(tmp, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        shutil.copy2(src, tmp)  # copy_file_range/sendfile where the kernel has it; keeps the mtime
        os.replace(tmp, dst)


class Keeper:
    """While the script runs (rank 0): every `every_s`, a new version of the in-place checkpoint
    that has stayed the same since the last look and is complete is copied to kept/."""

    def __init__(self, path: Path, task_dir: Path, every_s: float) -> None:
        self.path, self.kept, self.every_s = path, task_dir / KEPT / path.name, every_s
        self._stop = threading.Event()
        self._seen: Optional[tuple] = None
        self.copies = 0
        self._thread = threading.Thread(target=self._run, name="hpc-keeper", daemon=True)

    def __enter__(self) -> "Keeper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.look()

    def look(self) -> None:
        try:
            st = self.path.stat()
        except OSError:
            return
        now = (st.st_size, st.st_mtime_ns)
        stable, self._seen = now == self._seen, now
        if stable and is_complete(self.path)[0]:
            try:
                self.copies += keep(self.path, self.kept)
            except OSError as err:  # a full disk: the script goes on; the next look tries again
                print(f"[hpc] could not keep a copy of {self.path} in {self.kept} ({err}); trying again in "
                      f"{self.every_s:.0f}s", file=sys.stderr, flush=True)
