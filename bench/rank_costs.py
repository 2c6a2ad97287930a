"""One rank's filesystem work at resume, rank 0's commit, and a loading rank's DCP index, at 64 and
512 ranks, on checkpoints built in one process (no machine here launches 512 ranks).

    python -m bench --only rank-costs [--quick]

ops: a checkpoint as W ranks of an FSDP job commit it (each rank's list, files-R.json, names its
rank-R.pt, __R_0.distcp and __R.metadata; the marker names the lists) is built, and rank 5's store
lists the candidates and loads the newest (what TrainLoop.resume does before DCP reads the shards):
its stat, lstat, open, listdir and scandir calls are counted. commit: rank 0's blocking save with
the other ranks' lists and reports built (each list naming a shard of bench.index_merge's 300
tensors, a crc32 each; each report the list's checksum): wall and CPU time. index: from
bench.index_merge's parts (300 tensors, each sharded over every rank), the DCP index a loading
rank builds on the layout that saved (2 parts) and for a resharded load (all parts).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

from bench import index_merge
from bench.common import Context, fmt_s
from bench.report import Section

WORLDS = {False: (64, 512), True: (8, 64)}
RANK = 5
OPS_RATIO, COMMIT_S = 1.25, 1.0
_CALLS = {"n": 0, "on": False}


def _audit(event: str, args: tuple) -> None:
    if _CALLS["on"] and event in ("open", "os.listdir", "os.scandir"):
        _CALLS["n"] += 1


def synthetic_checkpoint(root: Path, world: int) -> Path:
    """A committed step-1 of `world` ranks under `root`, built in one process: real marker and
    per-rank states, empty DCP files and index parts (a resume's filesystem calls, not its bytes, are counted)."""
    from hpc.checkpoint import layout, rank_lists
    from hpc.checkpoint.dcp_index import rank_metadata
    from hpc.checkpoint.files import write_atomic

    step = root / "step-1"
    step.mkdir(parents=True)
    empty = {"bytes": 0, "crc32": "00000000"}
    files = {layout.SHARED: write_atomic(step / layout.SHARED, {"step": 1, "objects": {}})}
    for rank in range(world):
        own = {layout.rank_state(rank): write_atomic(step / layout.rank_state(rank), {"rng": rank})}
        for name in (f"__{rank}_0.distcp", rank_metadata(rank)):  # its shards and DCP's index of them
            (step / name).touch()
            own[name] = empty
        files[layout.rank_list(rank)] = rank_lists.write(step, rank, own)
    (step / layout.MARKER).write_text(json.dumps({"step": 1, "world_size": world, "files": files}))
    return root


def operations(world: int) -> int:
    """Filesystem calls of one rank's store at resume from a checkpoint of `world` ranks."""
    from hpc.checkpoint import CheckpointStore

    root = Path(tempfile.mkdtemp(prefix="hpc-bench-ops-"))
    real = {name: getattr(os, name) for name in ("stat", "lstat")}
    try:
        synthetic_checkpoint(root, world)
        store = CheckpointStore(root, rank=RANK, world_size=world)
        for name, fn in real.items():
            def counting(*args, _fn=fn, **kwargs):
                _CALLS["n"] += _CALLS["on"]
                return _fn(*args, **kwargs)
            setattr(os, name, counting)
        _CALLS["n"], _CALLS["on"] = 0, True
        state = store.load(max(store.candidates()))
        _CALLS["on"] = False
        assert state is not None, "the built checkpoint did not load"
        return _CALLS["n"]
    finally:
        _CALLS["on"] = False
        for name, fn in real.items():
            setattr(os, name, fn)
        shutil.rmtree(root, ignore_errors=True)


def commit(world: int) -> Dict[str, float]:
    """Rank 0's blocking save of step 1 at `world` ranks, the other ranks' reports already written:
    its own DCP save (a small layer), the reports collected, their claims checked, the marker
    written (each rank's list, whose shard entry holds TENSORS crc32s), the rename and the prune."""
    import torch

    from hpc.checkpoint import CheckpointStore, dcp_claim, layout, rank_lists, reports
    from hpc.checkpoint.dcp_claim import PRIME
    from hpc.checkpoint.dcp_engine import DcpEngine
    from hpc.checkpoint.dcp_index import rank_metadata
    from hpc.checkpoint.writer_lock import generation

    root = Path(tempfile.mkdtemp(prefix="hpc-bench-commit-"))
    try:
        tmp = root / layout.name("tmp", 1)
        tmp.mkdir()
        engine, model = DcpEngine(), torch.nn.Linear(64, 64)
        engine._rank_world = lambda: (0, world)  # rank 0 of `world`, without a process group
        engine.save(root / "probe", model, blocking=True, collectives=False)
        own = dcp_claim.take(root / "probe", 0)  # what rank 0 writes: the built ranks claim the rest
        empty = {"bytes": 0, "crc32": "00000000"}
        length = index_merge.ROWS * index_merge.COLS * 4 // world
        for rank in range(1, world):
            for name in (f"__{rank}_0.distcp", rank_metadata(rank), layout.rank_state(rank)):
                (tmp / name).touch()
            shard = {**empty, "items": [[t * length, length, "00000000"] for t in range(index_merge.TENSORS)]}
            written = (own["expected"] - own["written"]) % PRIME if rank == 1 else 0
            listed = rank_lists.write(tmp, rank, {layout.rank_state(rank): empty, f"__{rank}_0.distcp": shard,
                                                  rank_metadata(rank): empty})  # each rank's own work
            reports.send(tmp, rank, {"generation": generation(), "list": listed,
                                     "claim": {"expected": own["expected"], "written": written}})
        store = CheckpointStore(root, rank=0, world_size=world)

        def shards(directory, blocking):
            engine.save(directory, model, blocking=True, collectives=False)
            return engine.wait
        c0, t0 = time.process_time(), time.perf_counter()
        store.save(1, {"step": 1, "per_rank": {"rng": 0}}, blocking=True, sharded=shards)
        out = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
               "marker_bytes": (root / "step-1" / layout.MARKER).stat().st_size}
        store.close()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def load_index(world: int) -> Dict[str, float]:
    """A loading rank's DCP index from bench.index_merge's parts: on the layout that saved (its own
    part: under FSDP each rank writes its shards and its copy of the replicated values,
    hpc.checkpoint.replicas), and for a resharded load (every part merged); beside them, DCP's
    coordinator building .metadata from the same ranks' plans, as at a save with collectives."""
    from hpc.checkpoint.dcp_index import merge, rank_metadata, read_parts

    indexes, plans, results = index_merge._parts(world)
    root = Path(tempfile.mkdtemp(prefix="hpc-bench-index-"))
    try:
        for rank, blob in enumerate(indexes):
            (root / rank_metadata(rank)).write_bytes(blob)
        t0 = time.perf_counter()
        merge(read_parts(root, [RANK]))
        t1 = time.perf_counter()
        merge(read_parts(root, range(world)))
        t2 = time.perf_counter()
        (root / "dcp").mkdir()
        index_merge._dcp_coordinator(plans, results, root / "dcp")
        t3 = time.perf_counter()
        return {"near_s": t1 - t0, "all_s": t2 - t1, "dcp_s": t3 - t2, "part_bytes": len(indexes[0]),
                "merged_bytes": (root / "dcp" / ".metadata").stat().st_size}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(ctx: Context) -> Section:
    small, large = WORLDS[ctx.quick]
    sec = Section("rank-costs", "One rank's work at resume and rank 0's commit, at 64 and 512 ranks",
                  f"filesystem calls of one rank's resume at {large} ranks <= {OPS_RATIO} x at {small}; "
                  f"rank 0's commit at {large} ranks <= {fmt_s(COMMIT_S)} (wall, or CPU on a loaded machine)",
                  "python -m bench --only rank-costs" + (" --quick" if ctx.quick else ""),
                  headers=["what", "world", "measured", "bound", "detail"])
    sys.addaudithook(_audit)
    ops = {w: operations(w) for w in (small, large)}
    for w in (small, large):
        sec.rows.append(["filesystem calls of rank 5's resume", w, ops[w],
                         f"{OPS_RATIO * ops[small]:.0f}" if w == large else "",
                         "stat, lstat, open, listdir, scandir: store.candidates() and store.load(step)"])
    sec.verdicts.append((f"one rank's resume makes {ops[large]} filesystem calls at {large} ranks, {ops[small]} "
                         f"at {small}", ops[large] <= OPS_RATIO * ops[small]))
    commits = {w: commit(w) for w in (small, large)}
    for w in (small, large):
        c = commits[w]
        sec.rows.append(["rank 0's commit (built reports)", w, f"{fmt_s(c['wall_s'])} (CPU {fmt_s(c['cpu_s'])})",
                         fmt_s(COMMIT_S) if w == large else "",
                         f"its own DCP save (a 64 x 64 layer), {w - 1} reports collected, their claims checked, the "
                         f"marker written ({c['marker_bytes'] / 1e3:.0f} kB: a list per rank), renamed, pruned; "
                         "no rank's index part or list read"])
    c = commits[large]
    sec.verdicts.append((f"rank 0 commits {large} ranks' save in {fmt_s(c['wall_s'])}, CPU {fmt_s(c['cpu_s'])}, "
                         "reading none of their DCP index parts", min(c["wall_s"], c["cpu_s"]) <= COMMIT_S))
    for w in (small, large):
        m = load_index(w)
        sec.rows.append([f"rank {RANK}'s DCP index at a load (built parts)", w,
                         f"{fmt_s(m['near_s'])} / {fmt_s(m['all_s'])}", "",
                         f"on the layout that saved: its own part ({m['part_bytes'] / 1e3:.0f} kB) / "
                         f"resharded or DDP: all {w} parts merged, in every loading rank; DCP's coordinator at a "
                         f"save with collectives, on rank 0 while the others wait: {fmt_s(m['dcp_s'])} (.metadata "
                         f"{m['merged_bytes'] / 1e6:.1f} MB)"])
    sec.notes += [
        "ops: a rank checks the shared files (the marker, shared.pt), its list and its own files (rank-R.pt, "
        "its shard's and its DCP index part's sizes); the other ranks' files are checked by the load that reads them, "
        "as DCP reads them (hpc.checkpoint.dcp_reader)",
        "commit: each rank's DCP index part is committed as it is; rank 0 checks that the parts cover the "
        "state from two numbers per rank (hpc.checkpoint.dcp_claim) instead of merging tensors x ranks "
        "chunks (11 s of CPU at 512 ranks and 300 tensors before). The crc32 of each stored tensor "
        f"({index_merge.TENSORS} per rank here) is in its rank's list (files-R.json), which the rank writes "
        "and its report gives the checksum of: the marker names the lists, one entry per rank, and rank 0 "
        "reads no list (before: every rank's crc32s in the marker, 4.7 MB and 0.78 s of CPU at 512 ranks)",
        f"index: {index_merge.TENSORS} tensors, each sharded over every rank. On the layout that saved a rank "
        "reads its own part whatever the world size; a resharded load (or DDP, whose ranks load the whole state) "
        "merges every part in every loading rank: what reading a merged .metadata cost each rank before"]
    return sec
