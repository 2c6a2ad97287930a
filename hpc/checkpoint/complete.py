"""Whether a checkpoint a framework wrote is complete: hpc's rule for users' own scripts.

    ok, why = is_complete(Path("out/checkpoint-500"))

Frameworks resume from the newest checkpoint by name alone (HF Trainer's get_last_checkpoint,
Accelerate's load_state(), nanoGPT's out/ckpt.pt), so a job killed while saving crashes every later
attempt on a half-written one. The rule, from what each format itself guarantees:

- a file: not empty; a zip archive (torch.save, Lightning's .ckpt) must have its central directory,
  which is written last; a .safetensors file must be as long as its header says;
- a directory: holds at least one file, every file in it passes the file rule, none is named like
  work in progress (IN_PROGRESS), and the file its framework writes last is there (LAST_WRITTEN):
  HF Trainer's trainer_state.json in checkpoint-N, DCP's .metadata beside *.distcp shards,
  Accelerate's random_states_0.pkl in checkpoint_N.

Cost: one stat per file, and for a zip one read of its last 64 KiB; no file is read whole.
"""
from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from pathlib import Path
from typing import Tuple

SET_ASIDE = "incomplete"  # <task>/incomplete/<name>.<job>-<restart>: set aside before a launch, never deleted
IN_PROGRESS = re.compile(r"(^tmp|\.tmp$|\.partial$|\.incomplete$|^checkpoint-is-incomplete\.txt$)")
ZIP_MAGIC = b"PK\x03\x04"


def _last_written(path: Path, names: set) -> str:
    """The file path's framework writes last, by the directory's shape; '' if none is known."""
    if re.fullmatch(r"checkpoint-\d+", path.name) and ("trainer_state.json" in names or any(
            n.endswith((".safetensors", ".bin")) for n in names)):
        return "trainer_state.json"  # HF Trainer: weights, optimizer, scheduler, rng, then this
    if any(n.endswith(".distcp") for n in names):
        return ".metadata"  # torch.distributed.checkpoint: the shards, then the metadata
    if re.fullmatch(r"checkpoint_\d+", path.name):
        return "random_states_0.pkl"  # Accelerate's save_state: weights, optimizer, ..., rng per rank
    return ""


def file_complete(path: Path) -> Tuple[bool, str]:
    try:
        size = path.stat().st_size
        if size == 0:
            return False, f"{path} is empty"
        with open(path, "rb") as fh:
            head = fh.read(8)
            if head.startswith(ZIP_MAGIC):
                fh.seek(0)
                try:
                    zipfile.ZipFile(fh).close()  # reads the end record and central directory only
                except (zipfile.BadZipFile, OSError, ValueError) as err:
                    return False, f"{path} is a zip archive without its central directory ({err})"
            elif path.suffix == ".safetensors":
                return _safetensors_complete(path, fh, head, size)
    except OSError as err:
        return False, f"{path} cannot be read ({err.strerror or err})"
    return True, ""


def _safetensors_complete(path: Path, fh, head: bytes, size: int) -> Tuple[bool, str]:
    if len(head) < 8:
        return False, f"{path} is shorter than a safetensors header"
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
        return False, f"{path}: its header says {n} bytes but the file holds {size - 8}"
    try:
        header = json.loads(fh.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError):
        return False, f"{path} has a garbled safetensors header"
    if 8 + n + end > size:
        return False, f"{path} holds {size} bytes of {8 + n + end}"
    return True, ""


def is_complete(path: Path) -> Tuple[bool, str]:
    """(complete, why not) for a checkpoint file or directory, by the module docstring's rule."""
    path = Path(path)
    if path.is_file():
        return file_complete(path)
    if not path.is_dir():
        return False, f"{path} is missing"
    files = []
    for root, _dirs, names in os.walk(path):
        for name in names:
            if IN_PROGRESS.search(name):
                return False, f"{path} holds {name}, a file still being written"
            files.append(Path(root) / name)
    if not files:
        return False, f"{path} is empty"
    last = _last_written(path, {f.name for f in files})
    if last and not (path / last).exists():
        return False, f"{path} has no {last}, which is written last"
    for f in files:
        ok, why = file_complete(f)
        if not ok:
            return False, why
    return True, ""


def step_of(path: Path) -> int:
    """The number a checkpoint's name ends in (checkpoint-500, step-20, hpc_ckpt_3.ckpt), else -1."""
    found = re.findall(r"\d+", Path(path).name)
    return int(found[-1]) if found else -1


def set_aside_summary(task_dir: Path, show: int = 3) -> str:
    """What python -m hpc.status says about a task's set-aside checkpoints; '' when there are none."""
    try:
        names = sorted(os.listdir(Path(task_dir) / SET_ASIDE))
    except OSError:
        return ""
    if not names:
        return ""
    more = f" and {len(names) - show} more" if len(names) > show else ""
    return (f"{len(names)} incomplete checkpoint(s) set aside in {Path(task_dir) / SET_ASIDE}: "
            f"{', '.join(names[-show:])}{more}")
