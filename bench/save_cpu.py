"""Where a TrainLoop checkpoint's CPU goes: rank 0's thread CPU time per save in each phase of the
DCP save (on its writer thread) and of the store's commit (on the store's writer thread), 2 gloo
ranks, the model and optimizer of bench.ddp_overhead, a save every SAVE_EVERY steps.

    python -m bench.profile save-cpu      # -> bench/profiles/save-cpu.txt

py-spy cannot tell a waiting thread from a running one on this machine, so each phase is timed
with time.thread_time() around the function that runs it (the CPU of that thread only, its own
system time included): a writer's CPU is what it takes from training when no core is idle
(BENCHMARKS.md section 5). Phases nest: an indented line is part of the line above it.
"""
from __future__ import annotations

import collections
import functools
import sys
import time
from typing import Any, Dict, List, Tuple

from bench.common import emit

SAVE_EVERY, SAVES, WARMUP_SAVES = 5, 12, 2
STORE = "store commit, all of it (the store's writer thread)"  # once per save: the count of saves
# (module, attribute path, label): the functions timed, outermost first
PHASES: List[Tuple[str, str, str]] = [
    ("torch.distributed.checkpoint", "save", "dcp.save, all of it (DCP's writer thread)"),
    # DCP's object collectives (pickled plans and write results through the gloo group): TrainLoop
    # saves without them, so these stay at zero; a save through DCP's coordinator pays them
    ("torch.distributed.checkpoint.utils", "_DistWrapper.gather_object", "  gather the plans, then the write results, to rank 0"),
    ("torch.distributed.checkpoint.utils", "_DistWrapper.scatter_object", "  scatter the global plan"),
    ("torch.distributed.checkpoint.utils", "_DistWrapper.broadcast_object", "  broadcast the metadata"),
    ("torch.distributed.checkpoint.default_planner", "DefaultSavePlanner.create_local_plan", "  local plan"),
    ("torch.distributed.checkpoint.default_planner", "DefaultSavePlanner.create_global_plan", "  global plan (rank 0)"),
    ("torch.distributed.checkpoint.filesystem", "FileSystemWriter.write_data", "  write_data: serialise and write the shard"),
    ("torch.distributed.checkpoint.filesystem", "FileSystemWriter.finish", "  finish: this rank's index of its part"),
    ("hpc.checkpoint.store", "CheckpointStore._write", STORE),
    ("hpc.checkpoint.shardcrc", "own_shards", "  crc32s of this rank's shards (read back only where the writer did not see a range whole)"),
    ("hpc.checkpoint.store", "write_atomic", "  the rank file and rank 0's shared file"),
    ("hpc.checkpoint.reports", "collect", "  rank 0 waits for the other ranks' reports"),
    ("hpc.checkpoint.dcp_claim", "check", "  rank 0 checks the ranks' claims of what they wrote"),
    ("hpc.checkpoint.store", "CheckpointStore._commit", "  marker, rename, directory fsync, pruning"),
]


def instrument(acc: Dict[str, float], calls: collections.Counter) -> None:
    import importlib

    for module, path, label in PHASES:
        owner: Any = importlib.import_module(module)
        *parents, attr = path.split(".")
        for name in parents:
            owner = getattr(owner, name)
        fn = getattr(owner, attr)

        def timed(*args: Any, _fn: Any = fn, _label: str = label, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                acc[_label] += time.thread_time() - t
                calls[_label] += 1

        setattr(owner, attr, functools.wraps(fn)(timed))


def main() -> None:
    import torch

    import hpc.ddp
    from bench.ddp_overhead import _model_and_data, _sgd, init_by_hand
    from hpc.trainloop import TrainLoop

    torch.set_num_threads(1)
    acc: Dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    instrument(acc, calls)
    init_by_hand()
    main_cpu = 0.0
    with hpc.ddp.session(timeout_s=120) as s:
        model, data = _model_and_data()
        model = s.wrap(model)
        opt = _sgd(model)
        loader = s.loader(data, batch_size=32, seed=0)
        batches = loader.batches()
        with TrainLoop(s, sys.argv[1], save_every=SAVE_EVERY, tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt, "data": loader})
            save = loop.save

            def timed_save(*args: Any, **kwargs: Any) -> None:  # the training thread's part
                nonlocal main_cpu
                t = time.thread_time()
                save(*args, **kwargs)
                main_cpu += time.thread_time() - t

            loop.save = timed_save  # type: ignore[method-assign]
            for step in loop.steps(SAVE_EVERY * (SAVES + WARMUP_SAVES) + 1):
                if step == SAVE_EVERY * WARMUP_SAVES + 1:  # the first saves allocate and start threads
                    loop.store.wait()
                    acc.clear()
                    calls.clear()
                    main_cpu = 0.0
                x, y = next(batches)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            loop.store.wait()
    emit({"acc": dict(acc), "calls": dict(calls), "main": main_cpu, "labels": [label for *_, label in PHASES]})


def summary(result: Dict[str, Any]) -> List[str]:
    saves = max(1, result["calls"].get(STORE, 1))
    lines = [f"# rank 0, {saves} saves after {WARMUP_SAVES} dropped; thread CPU per save, ms", "",
             f"{result['main'] / saves * 1e3:8.2f}  TrainLoop.save in the training thread (staging copy, handoff)"]
    for label in result["labels"]:
        if label in result["acc"]:
            lines.append(f"{result['acc'][label] / saves * 1e3:8.2f}  {label}")
    return lines


if __name__ == "__main__":
    main()
