"""How the ranks tell rank 0 what they wrote into a checkpoint: one small report file each.

    send(tmp, rank, {"generation": g, "list": info, "claim": {...}})   # ranks > 0
    files = collect(tmp, world_size, generation, wait_s, claims)      # rank 0: {"files-R.json": info}

A report gives the checksum info of the rank's list of its files (hpc.checkpoint.rank_lists), so
rank 0 commits without reading any other rank's data, nor their crc32s per tensor: the marker
names each rank's list. Files, not a collective: a forked writer holds no process group, and a rank that died
or failed must cost rank 0 a timeout with the rank's name in it, never a hang in a collective. A
report is written atomically but not fsynced: it is a message, and the marker that repeats it is
fsynced; a crash before the marker leaves an uncommitted directory whatever the reports' state.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hpc.checkpoint.layout import rank_list, rank_report
from hpc.fs.atomic import write_bytes
from hpc.fs.sharedfs import listed

__all__ = ["send", "send_error", "collect", "files_of"]


def _path(tmp: Path, rank: int) -> Path:
    return tmp / rank_report(rank)


def send(tmp: Path, rank: int, report: dict[str, Any]) -> None:
    write_bytes(_path(tmp, rank), json.dumps(report).encode(), durable=False)


def send_error(tmp: Path, rank: int, generation: str, err: BaseException) -> None:
    """Tell rank 0 this rank's write failed, so it stops waiting and says why."""
    try:
        send(tmp, rank, {"generation": generation, "error": f"{type(err).__name__}: {err}"[:2000]})
    except OSError:
        pass  # rank 0 then waits out its timeout for this rank, as for a rank that died


def files_of(report: dict[str, Any], rank: int) -> dict[str, Any]:
    """name -> checksum info of what a report names for the marker: the rank's list of its files
    (every rank of one job runs the same code, so a report never comes in an older form)."""
    return {rank_list(rank): report["list"]} if "list" in report else {}


def collect(tmp: Path, world_size: int, generation: str, wait_s: float,
            claims: dict[int, Any] | None = None) -> dict[str, Any]:
    """Wait for the reports of ranks 1..world_size-1 of this generation; return the files they
    list (files_of), and put each rank's claim of what it wrote into `claims` (rank -> claim,
    hpc.checkpoint.dcp_claim; None for a rank that reported none). A report is looked for in a
    listing of the directory, never by opening its name before it exists: NFS would answer that
    lookup from its cache of misses for up to a minute (hpc.fs.sharedfs). Raises RuntimeError
    for a rank's failure, TimeoutError after wait_s."""
    # Short first pauses: the ranks finish their reports at about the time rank 0 finishes its
    # own part; the pause then grows, because each look lists the whole directory.
    files, pending, deadline, pause = {}, list(range(1, world_size)), time.monotonic() + wait_s, 0.002
    while pending:
        names = listed(tmp)
        for r in [r for r in pending if _path(tmp, r).name in names]:
            try:
                info = json.loads(_path(tmp, r).read_text())
            except (OSError, ValueError):
                info = {}  # being replaced by its writer: read it at the next look
            if isinstance(info, dict) and info.get("generation") == generation:
                if "error" in info:
                    raise RuntimeError(f"rank {r} could not write its checkpoint file: {info['error']}")
                files.update(files_of(info, r))
                if claims is not None:
                    claims[r] = info.get("claim")
                pending.remove(r)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(
                f"rank {pending[0]} did not write {_path(tmp, pending[0])} within {wait_s:.0f}s; "
                "checkpoint left incomplete. HINT: every rank must call save() with the same step.")
        if pending:
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)
    return files
