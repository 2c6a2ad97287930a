"""One rank's filesystem work at resume, and rank 0's index merge at commit, at 64 and 512 ranks,
on checkpoints built in one process (no machine here launches 512 ranks).

    python -m bench --only rank-costs [--quick]

ops: a checkpoint as W ranks of an FSDP job commit it (the marker lists every rank's rank-R.pt and
__R_0.distcp) is built, and rank 5's store lists the candidates and loads the newest (what
TrainLoop.resume does before DCP reads the shards): its stat, lstat, open, listdir and scandir
calls are counted. merge: bench.index_merge's parts (300 tensors, each sharded over every rank):
rank 0 merging the ranks' DCP indexes into .metadata, with the time of its two largest parts
measured apart: unpickling the W parts, and pickling the merged index.
"""
from __future__ import annotations

import io
import json
import os
import pickle
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
OPS_RATIO, MERGE_S = 1.25, 1.0
_CALLS = {"n": 0, "on": False}


def _audit(event: str, args: tuple) -> None:
    if _CALLS["on"] and event in ("open", "os.listdir", "os.scandir"):
        _CALLS["n"] += 1


def synthetic_checkpoint(root: Path, world: int) -> Path:
    """A committed step-1 of `world` ranks under `root`, built in one process: real marker and
    per-rank states, empty DCP files and index parts (a resume's filesystem calls, not its bytes, are counted)."""
    from hpc.checkpoint import layout
    from hpc.checkpoint.dcp_index import rank_metadata
    from hpc.checkpoint.files import write_atomic

    step = root / "step-1"
    step.mkdir(parents=True)
    empty = {"bytes": 0, "crc32": "00000000"}
    files = {layout.SHARED: write_atomic(step / layout.SHARED, {"step": 1, "objects": {}})}
    for rank in range(world):
        files[layout.rank_state(rank)] = write_atomic(step / layout.rank_state(rank), {"rng": rank})
        for name in (f"__{rank}_0.distcp", rank_metadata(rank)):  # its shards and DCP's index of them
            (step / name).touch()
            files[name] = empty
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


def merge_parts(world: int) -> Dict[str, float]:
    """index_merge.measure, and the merge's two largest parts timed apart."""
    from hpc.checkpoint import dcp_pickle
    from hpc.checkpoint.dcp_index import merge_metadata, rank_metadata

    m = index_merge.measure(world)
    indexes, _, _ = index_merge._parts(world)
    root = Path(tempfile.mkdtemp(prefix="hpc-bench-merge-cpu-"))
    try:  # the merge's CPU time, which a loaded machine does not stretch as it does the wall time
        for rank, blob in enumerate(indexes):
            (root / rank_metadata(rank)).write_bytes(blob)
        c0 = time.process_time()
        merge_metadata(root, world)
        m["cpu_s"] = time.process_time() - c0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    parts = [dcp_pickle.load(io.BytesIO(b), "part") for b in indexes]
    t1 = time.perf_counter()
    merged = parts[0]
    for p in parts[1:]:  # not a valid index (the storage keys are taken as they come): its size is what counts
        for fqn, meta in p.state_dict_metadata.items():
            merged.state_dict_metadata[fqn].chunks.extend(meta.chunks)
        merged.storage_data.update(p.storage_data)
    t2 = time.perf_counter()
    pickle.dumps(merged)
    t3 = time.perf_counter()
    return {**m, "unpickle_s": t1 - t0, "dumps_s": t3 - t2}


def run(ctx: Context) -> Section:
    small, large = WORLDS[ctx.quick]
    sec = Section("rank-costs", "One rank's work at resume and rank 0's index merge, at 64 and 512 ranks",
                  f"filesystem calls of one rank's resume at {large} ranks <= {OPS_RATIO} x at {small}; "
                  f"rank 0's index merge at {large} ranks <= {fmt_s(MERGE_S)} (wall, or CPU on a loaded machine)",
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
    for w in (small, large):
        m = merge_parts(w)
        sec.rows.append(["rank 0's index merge at commit (built parts)", w,
                         f"{fmt_s(m['hpc_s'])} (CPU {fmt_s(m['cpu_s'])})",
                         fmt_s(MERGE_S) if w == large else "",
                         f"of which unpickling the {w} parts about {fmt_s(m['unpickle_s'])} and pickling "
                         f".metadata about {fmt_s(m['dumps_s'])}; DCP's coordinator on the same parts "
                         f"{fmt_s(m['dcp_s'])}; the same index: {m['same']}; a rank's part "
                         f"{m['part_bytes'] / 1e3:.0f} kB, .metadata {m['metadata_bytes'] / 1e6:.1f} MB"])
        if w == large:
            sec.verdicts.append((f"rank 0 merges {w} ranks' indexes in {fmt_s(m['hpc_s'])}, CPU "
                                 f"{fmt_s(m['cpu_s'])} (unpickling the parts "
                                 f"{fmt_s(m['unpickle_s'])}, pickling .metadata {fmt_s(m['dumps_s'])})",
                                 min(m["hpc_s"], m["cpu_s"]) <= MERGE_S))
    sec.notes += [
        "ops: a rank checks the shared files (the marker, shared.pt, .metadata's size) and its own "
        "(rank-R.pt, its shard's size); the other ranks' files are checked by the load that reads them, "
        "as DCP reads them (hpc.checkpoint.dcp_reader)",
        f"merge: {index_merge.TENSORS} tensors, each sharded over every rank, so .metadata holds ranks x "
        "tensors chunks and every step of the merge (unpickling the parts, merging, pickling the result) "
        "grows with the world size; DCP's coordinator does the same work on rank 0 in a save with "
        "collectives, with every rank waiting for it. Not met at 512 ranks: the time is the Python "
        "objects of DCP's index (one per chunk and storage entry), built from each part and pickled "
        "again; rank 0 merges on its writer thread while training goes on"]
    return sec
