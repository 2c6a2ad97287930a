"""A task's working directory: where an unmodified script runs, owned by the run and the same for
every attempt, requeue, resubmission and new snapshot (<run>/<stage>/[task-<item>/]work).

    lay_out(work, code=<snapshot's copy of the submit dir>, live=<submit dir>, never=[run_dir])

What a relative path in the script then sees:

- a file of the code snapshot: a link to the snapshot's copy, so the code as submitted (relinked to a
  resubmission's new snapshot);
- a file or directory the snapshot left out (git-ignored data such as nanoGPT's data/*/train.bin,
  large untracked files): a link to the submit directory's, read in place, never copied;
- whatever the script writes: real files here, which later attempts find as they were left. A real
  file is never replaced by a link.

Never linked from the live tree: Python files and packages the snapshot left out (nothing of the live
tree is importable), version-control directories, the run directory, and entries named like
outputs (OUTPUT_NAMES), so that a new run neither resumes from nor writes into a stale local out/ or
lightning_logs/. Without a snapshot (code=None) the live tree is the code, and its Python files are
linked too. Cost: one symlink per file of the snapshot (at most hpc.rundir.codefiles.MAX_FILES) plus
one per left-out entry; a directory the snapshot has no file in is linked whole, however big.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

# Left-out directories and files with these names are not linked: frameworks write their outputs and
# checkpoints there (Lightning, HF Trainer, nanoGPT, torchtitan, wandb, MLflow, TensorBoard).
OUTPUT_NAMES = frozenset({"out", "outputs", "output", "lightning_logs", "checkpoints", "wandb", "mlruns",
                          "runs", "logs", "tb_logs"})
VCS = frozenset({".git", ".hg", ".svn", "__pycache__"})


@dataclass
class Layout:
    code_links: int = 0  # links to the snapshot
    data_links: int = 0  # links to left-out entries of the submit directory
    kept: int = 0  # real entries the script wrote, left as they are


def lay_out(work: Path, code: Optional[Path], live: Path, never: Iterable[Path] = (),
            outputs: Iterable[str] = OUTPUT_NAMES) -> Layout:
    """Make `work` show `code` over `live` as the module docstring says; safe to repeat (each attempt
    relinks to the snapshot it runs)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    done = Layout()
    _mirror(work, Path(code) if code else None, Path(live), [Path(p).resolve() for p in never],
            frozenset(outputs), code is None, done)
    return done


def _mirror(work: Path, code: Optional[Path], live: Path, never: Sequence[Path], outputs: frozenset,
            live_is_code: bool, done: Layout) -> None:
    ours = _names(code)
    theirs = _names(live)
    for name in sorted(ours | theirs):
        dst = work / name
        if name in ours:
            src = code / name  # type: ignore[operator]
            if src.is_dir() and not src.is_symlink():
                if _real_dir(dst, done):
                    _mirror(dst, src, live / name, never, outputs, live_is_code, done)
            elif _link(dst, src, done):
                done.code_links += 1
            continue
        src = live / name
        resolved = src.resolve()
        if name in VCS or any(resolved == n for n in never) or not _wanted(src, name, outputs, live_is_code):
            _unlink_stale(dst)
            continue
        if dst.is_dir() and not dst.is_symlink():  # made by an earlier layout, or by the script
            _mirror(dst, None, src, never, outputs, live_is_code, done)
        elif any(resolved in n.parents for n in never):  # holds the run dir: link around it
            if _real_dir(dst, done):
                _mirror(dst, None, src, never, outputs, live_is_code, done)
        elif _link(dst, src, done):
            done.data_links += 1
    for name in _names(work) - ours - theirs:  # a file the new snapshot no longer has
        _unlink_stale(work / name)


def _names(directory: Optional[Path]) -> set:
    if directory is None:
        return set()
    try:
        return set(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _wanted(src: Path, name: str, outputs: frozenset, live_is_code: bool) -> bool:
    if name in outputs:
        return False
    if live_is_code:
        return True
    if name.endswith((".py", ".pyc", ".so", ".pth")):
        return False
    return not (src.is_dir() and (src / "__init__.py").exists())  # a package: code, not data


def _real_dir(dst: Path, done: Layout) -> bool:
    """dst as a directory of the working dir (a link from an earlier layout is replaced)."""
    if dst.is_symlink():
        dst.unlink()
    elif dst.exists() and not dst.is_dir():
        done.kept += 1  # the script wrote a file where the code now has a directory: keep its file
        return False
    dst.mkdir(exist_ok=True)
    return True


def _link(dst: Path, src: Path, done: Layout) -> bool:
    """Point dst at src; a real file or directory the script wrote stays."""
    if dst.is_symlink():
        if os.readlink(dst) == str(src):
            return True
        tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.link")
        os.symlink(src, tmp)
        os.replace(tmp, dst)  # atomic: a reader sees the old link or the new one
        return True
    if dst.exists():
        done.kept += 1
        return False
    os.symlink(src, dst)
    return True


def _unlink_stale(dst: Path) -> None:
    if dst.is_symlink():
        dst.unlink()

