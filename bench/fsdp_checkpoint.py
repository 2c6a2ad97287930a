"""FSDP checkpoints beside DDP's, in the same run: the stall of TrainLoop's periodic asynchronous
save (DCP shards under FSDP, the store's background writer under DDP) and preemption to safe
(SIGTERM -> checkpoint committed), for the same model on 2 gloo ranks.

    python -m bench --only fsdp-checkpoint
    RANK=0 ... python -m bench.fsdp_checkpoint --mode stall --runs fsdp/async --out DIR  # one rank

Stall: per strategy two launches (--quick: the four runs in turn in one launch): TrainLoop saving
every SAVE_EVERY steps in the background (its normal periodic save), and TrainLoop with a blocking
save (loop.save(blocking=True)) at the same steps, the reference a save is compared with. The
stall is the time spent inside the save call, as in bench.checkpoint_stall. Beside it, the extra
time of a step that ends in a save: a step's time runs from the top of one iteration to the top
of the next, so a save lands in its step, and the extra is its median minus the median of the
same run's steps without a save (the drift between launches of a shared machine, larger than
the stall, cancels out).

Preemption: the ranks train in a TrainLoop that saves nothing periodically; once rank 0 has
trained a step both ranks get SIGTERM (as SLURM signals every task); rank 0 reports when the stop
had committed the checkpoint (outside SLURM: JobNotRequeued). The bound is bench.preempt_safe's,
2 x an fsync'd write of the same bytes (measured right after, after a sync and a pause) + 0.5 s,
plus two of the run's steps: the ranks stop at a step boundary they agree on, through a vote read
one step after it was cast (hpc.recovery.stopsignal), so a signal that lands early in a step is acted on
after that step and the next. A step of 100 ms or less, as bench.preempt_safe's, hides this;
FSDP's 0.3 s steps on this CPU do not.
"""
from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from typing import Dict, List

from bench.common import Context, emit, fmt_s, fsync_write_seconds, median
from bench.ddp_overhead import WARMUP, _sgd, _steps
from bench.fsdp_step import BATCH, model_and_data
from bench.preempt_safe import settled_probe
from bench.ranks import rank0_result, repeated_note, run_ranks, start_ranks, twice
from bench.report import Section

STRATEGIES = ("ddp", "fsdp")
VARIANTS = ("async", "blocking")
SAVE_EVERY = 10
WIDTH, BLOCKS = 1024, 12  # 12 x 4 MiB of weights, twice that with SGD's momentum
STALL_RATIO = 0.10  # as bench.checkpoint_stall: blocked per background save <= 10% of a blocking one
# The ranks' collectives wait TIMEOUT_S at most; TrainLoop's hang watchdog (on, as in a user's job) fires
# before that, as it must (hpc.recovery.watchdog): longer, a hung collective would fail the run first.
TIMEOUT_S, WATCHDOG_S = 120, 60


def _build(s, strategy: str, blocks: int):
    model, data = model_and_data(WIDTH, blocks)
    model = s.wrap(model, strategy=strategy)
    opt = _sgd(model)
    return model, opt, s.loader(data, batch_size=BATCH, seed=0)


def stalls(runs: List[str], steps: int, out: str, blocks: int = BLOCKS) -> Dict[str, Dict]:
    """Each "strategy/variant" of `runs` in turn, in one session, each TrainLoop in out/<strategy>-<variant>."""
    import hpc.ddp

    with hpc.ddp.session(timeout_s=TIMEOUT_S) as s:
        return {run: stall(s, *run.split("/"), steps, str(Path(out) / run.replace("/", "-")), blocks) for run in runs}


def stall(s, strategy: str, variant: str, steps: int, out: str, blocks: int = BLOCKS) -> Dict:
    from hpc.trainloop import TrainLoop

    model, opt, loader = _build(s, strategy, blocks)
    every = SAVE_EVERY if variant == "async" else 10**9
    total = steps + WARMUP
    with TrainLoop(s, out, save_every=every, keep=2, tensorboard=False, watchdog_s=WATCHDOG_S) as loop:
        loop.resume({"model": model, "optimizer": opt, "data": loader})

        blocked, save = [], loop.save

        def timed_save(*args, **kwargs) -> None:  # loop.steps calls it through the instance
            t0 = time.perf_counter()
            save(*args, **kwargs)
            if WARMUP < loop.current < total:  # the first save also allocates staging buffers
                blocked.append(time.perf_counter() - t0)

        def blocking(step: int) -> None:
            if variant == "blocking" and step % SAVE_EVERY == 0 and step < total:
                loop.save(blocking=True)  # the state of step - 1: the body of `step` is done

        loop.save = timed_save
        times = _steps(model, opt, loader, s.all_reduce_mean, loop.steps(total), blocking)
        del loop.save  # the final checkpoint is not a periodic one
    return {"step_s": times, "first_step": WARMUP + 1, "total": total, "blocked_s": blocked}


def preempt(strategy: str, out: str, blocks: int = BLOCKS) -> None:
    import hpc.ddp
    from hpc.recovery.preemption import JobNotRequeued
    from hpc.trainloop import TrainLoop

    with hpc.ddp.session(timeout_s=TIMEOUT_S) as s:
        model, opt, loader = _build(s, strategy, blocks)
        loop, ready = TrainLoop(s, out, save_every=10**9, tensorboard=False, watchdog_s=WATCHDOG_S), []

        def announce(step: int) -> None:
            ready.append(time.time())
            if len(ready) == 2 and s.is_main:
                print("READY", flush=True)  # the parent signals after this

        try:
            with loop:  # the stop leaves it by JobNotRequeued: no final checkpoint, no collective
                loop.resume({"model": model, "optimizer": opt, "data": loader})
                _steps(model, opt, loader, s.all_reduce_mean, loop.steps(10**9), announce)
        except JobNotRequeued:  # raised once the checkpoint is committed and the stop decided
            emit({"t_safe": time.time(), "t_signal_seen": loop.flag.received_at, "step": loop.step,
                  "step_s": (ready[-1] - ready[1]) / max(1, len(ready) - 2)})


def _save_steps(r: Dict) -> List[int]:
    """Indices into r["step_s"] of the steps that end in a save."""
    return [i for i in range(len(r["step_s"]))
            if (r["first_step"] + i) % SAVE_EVERY == 0 and r["first_step"] + i < r["total"]]


def _extra(r: Dict) -> float:
    """Median step ending in a save minus the median of the launch's other steps."""
    saves = set(_save_steps(r))
    return (median([t for i, t in enumerate(r["step_s"]) if i in saves])
            - median([t for i, t in enumerate(r["step_s"]) if i not in saves]))


def _checkpoint_bytes(out: Path) -> int:
    steps = sorted((out / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    if not steps or not (steps[-1] / "COMPLETE.json").exists():
        raise RuntimeError(f"no committed checkpoint in {out / 'checkpoints'}")
    return sum(f.stat().st_size for f in steps[-1].rglob("*") if f.is_file())


def preempt_once(strategy: str, out: Path, settle: bool = True, blocks: int = BLOCKS) -> Dict[str, float]:
    procs = start_ranks("fsdp_checkpoint", ["--mode", "preempt", "--strategy", strategy, "--out", str(out),
                                            "--blocks", str(blocks)])
    try:
        line = procs[0].stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"{strategy} ranks did not start training: {line!r} "
                               f"{procs[0].stderr.read()[-1500:]}")
        time.sleep(0.5)  # a few steps in
        t_signal = time.time()
        for p in procs:
            p.send_signal(signal.SIGTERM)
    except BaseException:
        for p in procs:
            p.kill()
        raise
    r = rank0_result(procs, f"{strategy} preemption")
    nbytes = _checkpoint_bytes(out)
    return {"safe": r["t_safe"] - t_signal, "seen": r["t_signal_seen"] - t_signal, "step_s": r["step_s"],
            "bytes": nbytes, "write": (settled_probe if settle else fsync_write_seconds)(
                out.parent / f"{out.name}-probe", nbytes)}


def run(ctx: Context) -> Section:
    steps = SAVE_EVERY + 1 if ctx.quick else 6 * SAVE_EVERY  # quick: one save, at step 2 * SAVE_EVERY
    blocks = 2 if ctx.quick else BLOCKS
    sec = Section("fsdp-checkpoint", "FSDP checkpoint stall and preemption to safe, beside DDP (gloo, 2 ranks)",
                  f"training blocked per asynchronous save <= {STALL_RATIO:.0%} of a blocking save; "
                  "SIGTERM -> checkpoint committed <= 2 x fsync'd write of the same bytes + 0.5 s + 2 steps",
                  "python -m bench --only fsdp-checkpoint" + (" --quick" if ctx.quick else ""),
                  headers=["strategy", "checkpoint bytes", "step (no save)", "blocked/save: async",
                           "blocked/save: blocking", "ratio", "extra at save step: async / blocking",
                           "SIGTERM -> handler", "SIGTERM -> safe", "fsync'd write", "step (preemption run)",
                           "bound (2x write + 0.5 s + 2 steps)"])
    results: Dict[str, Dict[str, Dict]] = {s: {} for s in STRATEGIES}
    repeated: List[str] = []
    runs = [f"{strategy}/{v}" for strategy in STRATEGIES for v in VARIANTS]  # one strategy's variants in turn
    # a launch per run; a quick run, a smoke test, measures them all in one launch (one start-up)
    for launch in ([runs] if ctx.quick else [[r] for r in runs]):
        out = ctx.scratch("fsdp-stall-" + "-".join(r.replace("/", "-") for r in launch))
        args = ["--mode", "stall", "--runs", *launch, "--steps", str(steps), "--out", str(out), "--blocks", str(blocks)]
        for run, result in run_ranks("fsdp_checkpoint", args, out, f"{' '.join(launch)} saves", repeated).items():
            strategy, v = run.split("/")
            results[strategy][v] = result
    for strategy in STRATEGIES:
        r = results[strategy]
        extra = {v: _extra(r[v]) for v in VARIANTS}
        base = median([t for i, t in enumerate(r["async"]["step_s"]) if i not in _save_steps(r["async"])])
        blocked = {v: median(r[v]["blocked_s"]) for v in VARIANTS}
        ratio = blocked["async"] / blocked["blocking"]
        out = ctx.scratch(f"fsdp-preempt-{strategy}")
        p = twice(lambda: preempt_once(strategy, out, settle=not ctx.quick, blocks=blocks), out, repeated)
        bound = 2 * p["write"] + 0.5 + 2 * p["step_s"]  # the agreed stop: see the module docstring
        sec.rows.append([strategy.upper(), f"{p['bytes'] / 2**20:.1f} MiB", fmt_s(base), fmt_s(blocked["async"]),
                         fmt_s(blocked["blocking"]), f"{ratio:.1%}",
                         f"{fmt_s(extra['async'])} / {fmt_s(extra['blocking'])}",
                         fmt_s(p["seen"]), fmt_s(p["safe"]), fmt_s(p["write"]), fmt_s(p["step_s"]), fmt_s(bound)])
        sec.verdicts.append((f"{strategy.upper()}: blocked {fmt_s(blocked['async'])} per asynchronous save, "
                             f"{ratio:.1%} of a blocking save ({fmt_s(blocked['blocking'])}); its step took "
                             f"{fmt_s(extra['async'])} longer than the others", ratio <= STALL_RATIO))
        sec.verdicts.append((f"{strategy.upper()}: safe {fmt_s(p['safe'])} after SIGTERM, bound {fmt_s(bound)}",
                             p["safe"] <= bound))
    sec.notes += [
        f"model: MLP 64-{WIDTH}, {blocks} blocks of {WIDTH}x{WIDTH} (FSDP's units), a 10-way head; SGD with "
        f"momentum, batch {BATCH} per rank; 2 local processes with one thread each, gloo over 127.0.0.1. "
        "TrainLoop saves the model and optimizer through DCP under both strategies (under FSDP each rank "
        "writes its shards, under DDP its share of the replicated tensors; each rank stages only what it "
        "writes, in hpc's kept buffers), and every rank its RNG and data position through "
        "the store's writer. This is why section 2's DDP figure differs: there the store's own writer saves "
        "one process's state, and from 256 MiB forks instead of copying",
        f"saves every {SAVE_EVERY} steps, {steps} steps measured per run after {WARMUP} warm-up steps, "
        + ("the four runs in turn in one launch" if ctx.quick else "one launch per strategy and variant")
        + "; blocked/save = median time inside TrainLoop's save call (state "
        "copied or staged, the previous write waited for if still running; the blocking one writes and "
        "commits); extra at save step = median step that ends in a save minus the median of the same "
        "launch's other steps ('step (no save)' is the asynchronous launch's): it also shows the writer "
        "competing with training for the CPU on a 2-core machine, and it is within the steps' noise here",
        "preemption: one run per strategy; SIGTERM to both ranks once training runs; 'safe' = the stop "
        "committed the checkpoint (files and DCP metadata written, marker, renames) and decided not to "
        "requeue (outside SLURM); the fsync'd write of the same bytes is probed right after, after a sync "
        "and a pause (see bench.preempt_safe)"] + repeated_note(repeated)
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fsdp_checkpoint")
    p.add_argument("--mode", choices=["stall", "preempt"], required=True)
    p.add_argument("--strategy", choices=STRATEGIES, help="preempt: the strategy")
    p.add_argument("--runs", nargs="+", choices=[f"{s}/{v}" for s in STRATEGIES for v in VARIANTS],
                   help="stall: the strategy/variant runs, in turn")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", required=True, help="TrainLoop's directory")
    p.add_argument("--blocks", type=int, default=BLOCKS, help="the model's size (--quick: 2)")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    if a.mode == "stall":
        emit(stalls(a.runs, a.steps, a.out, a.blocks))
    else:
        preempt(a.strategy, a.out, a.blocks)


if __name__ == "__main__":
    main()
