"""DDP overhead: step time with hpc.ddp.session (wrap, loader, all_reduce_mean) against hand-written
torch.distributed DDP on the same model and data (gloo, 2 ranks on this machine); and the same
with checkpoints every SAVE_EVERY steps: hpc.trainloop.TrainLoop (background saves, the stop
vote) against the hand-written loop saving model and optimizer with torch.save on rank 0. The
checkpoint pair runs once more in one process, which leaves a core free for the background write
as a GPU node does (its training thread mostly waits for the device): the cost of a save with
and without a core to spare.

    python -m bench --only ddp
    RANK=0 ... python -m bench.ddp_overhead --pair session --out DIR     # one rank (torchrun-style env)

Each launch starts 2 processes with torchrun-style variables that train both variants of a pair
(hand-written A, hpc B) in alternating blocks of steps (bench.interleave). A step's time runs from
the top of one step to the top of the next, so it includes what the loop does between steps
(TrainLoop's saves and votes). Without checkpoints the median step per block is compared; with
them the mean, since a save lands in one step of SAVE_EVERY and a median would not see it.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from statistics import mean
from typing import Any, Dict, List

from bench.common import Context, emit, fmt_s, median
from bench.interleave import BOOTSTRAP, Arm, Estimate, built_in_order, p90, paired_ratio, pooled, run_blocks
from bench.ranks import WORLD, repeated_note, run_ranks
from bench.report import Section

TARGET = 1.02
LAUNCHES, BLOCKS = 8, 8  # launches per pair, block pairs per launch (of 2 * SAVE_EVERY steps: the checkpoint pair)
# The pairs without checkpoints alternate every few steps: a change of load then hits both arms of a
# pair alike far more often than over 40 steps (the control pair's interval narrows accordingly).
STEP_BLOCK, STEP_BLOCKS = 4, 80
STEP_LAUNCHES = 16  # their ratios are read against 1.02 within a few per cent: twice the launches
BATCH = 32
WARMUP = 10
SAVE_EVERY = 20
# variant name (command line) -> row name
VARIANTS = {"torch": "hand-written torch DDP", "hpc": "hpc.ddp.session",
            "torch-save": f"hand-written + torch.save on rank 0 every {SAVE_EVERY}",
            "trainloop": f"hpc TrainLoop, checkpoint every {SAVE_EVERY}",
            "loop": "hpc TrainLoop, no save due"}
PAIR_WORLD = {"save1": 1}  # pairs run at another world size than WORLD (one process: a core free)


def _model_and_data():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    data = torch.utils.data.TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
    return model, data


def _train_step(model, opt, x, y, reduce_mean) -> None:
    """Forward, backward and update on one batch, then the logged loss averaged over ranks."""
    import torch

    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    reduce_mean(loss.detach())


def _steps(model, opt, loader, reduce_mean, ticks, after_step=None) -> List[float]:
    """Train one step per item of `ticks`; the time between the tops of consecutive iterations."""
    tops, it = [], iter(loader)
    for step in ticks:
        tops.append(time.perf_counter())
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        _train_step(model, opt, x, y, reduce_mean)
        if after_step is not None:
            after_step(step)
    tops.append(time.perf_counter())
    return [b - a for a, b in zip(tops, tops[1:])][WARMUP:]


def _sgd(model):
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # momentum: optimizer state


def batches_by_hand(loader, sampler):
    """Endless batches as a hand-written loop draws them: set_epoch, then the epoch's batches."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def stepper(model, opt, batches, reduce_mean, ticks=None, after_step=None):
    """One training step per call: `ticks` (TrainLoop.steps) is advanced first, as a `for` does."""
    def step():
        i = next(ticks) if ticks is not None else None
        x, y = next(batches)
        _train_step(model, opt, x, y, reduce_mean)
        if after_step is not None:
            after_step(i)
    return step


def init_by_hand():
    """What a user writes by hand: the process group from torchrun-style variables."""
    import datetime
    import os

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    return rank, world


def hand_written(rank: int, world: int, out: str, checkpoints: bool) -> Arm:
    """DDP, DistributedSampler, an all_reduce of the loss; torch.save on rank 0 every SAVE_EVERY."""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    model, data = _model_and_data()
    model = DistributedDataParallel(model)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)
    opt, count = _sgd(model), [0]

    def reduce_mean(t):
        dist.all_reduce(t)
        return t / world

    def save(_):
        count[0] += 1
        if checkpoints and rank == 0 and count[0] % SAVE_EVERY == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": count[0]},
                       os.path.join(out, "checkpoint.pt"))

    return Arm("torch", stepper(model, opt, batches_by_hand(loader, sampler), reduce_mean, after_step=save))


def with_hpc(s, stack, out: str, checkpoints: bool, total: int, save_every: int = SAVE_EVERY) -> Arm:
    """s.wrap, s.loader(...).batches(), s.all_reduce_mean; with checkpoints inside a TrainLoop, whose
    background write still running at the end of a block is waited for inside the block (with
    `save_every` beyond `total`, TrainLoop's loop alone: its stop checks, no save)."""
    from hpc.trainloop import TrainLoop

    model, data = _model_and_data()
    model = s.wrap(model)
    opt = _sgd(model)
    loader = s.loader(data, batch_size=BATCH, seed=0)
    if not checkpoints:
        return Arm("hpc", stepper(model, opt, loader.batches(), s.all_reduce_mean))
    loop = stack.enter_context(TrainLoop(s, out, save_every=save_every, tensorboard=False))
    loop.resume({"model": model, "optimizer": opt, "data": loader})
    return Arm("hpc", stepper(model, opt, loader.batches(), s.all_reduce_mean, ticks=iter(loop.steps(total))),
               block_end=loop.store.wait)


def child(pair: str, blocks: int, size: int, out: str, b_first: bool, only: str = "") -> dict:
    """Both arms in these processes, trained in alternating blocks (bench.interleave)."""
    import contextlib

    import torch.distributed as dist

    import hpc.ddp

    rank, world = init_by_hand()
    try:
        with contextlib.ExitStack() as stack:
            s = stack.enter_context(hpc.ddp.session(timeout_s=120))  # finds the group made above
            checkpoints, total = pair.startswith("save"), (blocks + 1) * size + 1

            def build_b():
                if pair == "control":  # hand-written against a second copy of itself
                    return Arm("hpc", hand_written(rank, world, out, False).step)
                if pair == "loop":  # TrainLoop with no save due, against the loop without saves
                    return with_hpc(s, stack, out, True, total, save_every=total + 1)
                return with_hpc(s, stack, out, checkpoints, total)

            a, b = built_in_order(lambda: hand_written(rank, world, out, checkpoints), build_b, b_first)
            times = run_blocks(a, b, blocks, size, b_first, only)
        dist.barrier()  # rank 0 may still be saving: tearing gloo down under it aborts the peer
        return times
    finally:
        dist.destroy_process_group()


def measure(ctx: Context, module: str, pairs: Dict[str, Any], launches: int, blocks: int, size: int,
            repeated: List[str]) -> Dict[str, List[dict]]:
    """`launches` launches per pair, the pairs alternating, B first in every other launch. A pair
    mapped to (blocks, size) trains in those blocks instead of the common ones; to (blocks, size,
    n), also in n launches instead of `launches`."""
    runs: Dict[str, List[dict]] = {p: [] for p in pairs}
    plan = {p: (*(own or (blocks, size)), launches)[:3] for p, own in pairs.items()}  # (blocks, size, launches)
    for i in range(max(times for *_, times in plan.values())):
        for p, (n, steps, times) in plan.items():
            if i >= times:
                continue
            out = ctx.scratch(f"{module}-{p}-{i}")
            args = ["--pair", p, "--blocks", str(n), "--block-steps", str(steps), "--out", str(out)]
            args += ["--b-first"] if i % 2 else []
            runs[p].append(run_ranks(module, args, out, f"{module} {p}", repeated, PAIR_WORLD.get(p, WORLD)))
    return runs


def rows(sec: Section, names: Dict[str, str], runs: List[dict], stat: str, target: float) -> Estimate:
    """A row per arm of one pair; the verdict of B's ratio to A's; the estimate."""
    est = paired_ratio(runs, "torch", "hpc", stat)
    for arm, ratio in (("torch", "1.000x"), ("hpc", est.text())):
        ts = pooled(runs, arm)
        sec.rows.append([names[arm], fmt_s(median(ts)), fmt_s(mean(ts)), fmt_s(p90(ts)), str(len(ts)),
                         ratio, "1.000x" if arm == "torch" else f"{est.p90_ratio:.3f}x"])
    sec.verdicts.append((f"{names['hpc']}: {est.text()} of {names['torch']} ({stat} step per block, "
                         f"{est.pairs} block pairs in {est.launches} launches; target {target}x): "
                         f"{est.verdict(target)}", est.hi <= target))
    return est


SAVE_CPU = Path(__file__).parent / "profiles" / "save-cpu.txt"
def ratio_row(sec: Section, name: str, runs: List[dict], stat: str) -> Estimate:
    """A row of B's ratio to A alone (no step times, no verdict): a control or a decomposition."""
    est = paired_ratio(runs, "torch", "hpc", stat)
    sec.rows.append([name, "", "", "", str(len(pooled(runs, "hpc"))), est.text(), f"{est.p90_ratio:.3f}x"])
    return est


PROFILE_NOTE = ("profiles: bench/profiles/ddp-*.txt, save-*.txt, fsdp-*.txt (python -m bench.profile TARGET "
                "ARM): in the session step hpc's frames (all_reduce_mean, the resumable loader) take the share "
                "of a step that the hand-written loop's all_reduce and DistributedSampler loader take. Earlier runs "
                "of this section, kept for the record (this command does not repeat them): changes that did not "
                "move TrainLoop's ratio beyond the spread between runs (1.037x and 1.047x in two runs without any): "
                "the checkpoint writer threads at nice 19 (1.041x), Python's GIL switch interval at 0.5 ms instead "
                "of 5 ms (1.045x), and TrainLoop's saves without DCP's collectives (1.040x before, 1.033x and "
                "1.047x after: kept, since at scale it spares every save 4 object collectives and rank 0 the "
                "handling of every rank's plan)")


def save_profile_note() -> str:
    """Where a save's CPU goes, as the kept profile (bench/profiles/save-cpu.txt) gives it."""
    try:
        lines = SAVE_CPU.read_text().splitlines()
    except OSError:
        return f"{SAVE_CPU.name} is missing: python -m bench.profile save-cpu writes it"
    phases = []
    for line in lines:
        ms, _, what = line.strip().partition("  ")
        try:
            value = float(ms)
        except ValueError:
            continue  # the header, or a line without a figure
        if not what.startswith(" "):  # a phase; its parts are indented under it
            phases.append(f"{what.strip()} {value:.1f} ms")
    return ("where a save's CPU goes, per save on rank 0, from the kept profile bench/profiles/save-cpu.txt "
            "(python -m bench.profile save-cpu; its parts are listed there): " + "; ".join(phases))


def crc_note(world: int) -> str:
    """What checksumming one rank's share of the checkpoint costs here, measured now."""
    import time
    import zlib

    model, _ = _model_and_data()
    share = 2 * sum(p.numel() * p.element_size() for p in model.parameters()) // world  # weights and momentum
    data, times = bytes(share), []
    for _ in range(21):
        t0 = time.perf_counter()
        zlib.crc32(data)
        times.append(time.perf_counter() - t0)
    return (f"what is left is the work hpc's guarantees need and torch.save on rank 0 does not do: every byte "
            f"checksummed (zlib's crc32 of one rank's share, {share / 1e6:.1f} MB, takes {median(times) * 1e3:.1f} ms "
            "here, on each rank at every save), every file fsynced, each rank's RNG and data position written, "
            "the state copied so that training goes on while it is written. With 2 ranks on 2 busy cores each "
            "millisecond of it is taken from training; with a core free, as on a GPU node where the training "
            "thread waits for the device, the 1-process row shows what the same saves cost the step")


HEADERS = ["variant", "median step", "mean step", "p90 step", "steps measured", "ratio (95% interval)",
           "p90 ratio"]


def run(ctx: Context) -> Section:
    launches, blocks, size = (1, 1, SAVE_EVERY) if ctx.quick else (LAUNCHES, BLOCKS, 2 * SAVE_EVERY)
    steps = None if ctx.quick else (STEP_BLOCKS, STEP_BLOCK, STEP_LAUNCHES)
    sec = Section("ddp", "DDP overhead (gloo, 2 ranks)",
                  f"hpc session step time <= {TARGET} x hand-written torch DDP; TrainLoop with "
                  f"checkpoints <= {TARGET} x hand-written with torch.save on rank 0",
                  "python -m bench --only ddp" + (" --quick" if ctx.quick else ""), headers=HEADERS)
    repeated: List[str] = []
    runs = measure(ctx, "ddp_overhead", {"session": steps, "control": steps, "save": None, "save1": None,
                                         "loop": None}, launches, blocks, size, repeated)
    rows(sec, {"torch": VARIANTS["torch"], "hpc": VARIANTS["hpc"]}, runs["session"], "median", TARGET)
    rows(sec, {"torch": VARIANTS["torch-save"], "hpc": VARIANTS["trainloop"]}, runs["save"], "mean", TARGET)
    control = ratio_row(sec, f"control: {VARIANTS['torch']}, a second copy", runs["control"], "median")
    sec.notes.append(f"control: hand-written DDP against a second copy of itself, measured as the session pair is: "
                     f"{control.text()}; an interval this wide around 1.000x is the method's resolution at this load")
    loop = ratio_row(sec, f"{VARIANTS['loop']} (against {VARIANTS['torch']})", runs["loop"], "mean")
    sec.notes.append(f"TrainLoop with no save due in the blocks, against the hand-written loop without saves, "
                     f"measured as the checkpoint pair is: {loop.text()} ({loop.pairs} block pairs in "
                     f"{loop.launches} launches) for TrainLoop's own step (its stop checks and votes, the step "
                     "counter, the loader's position)" + (
                         ": the interval includes 1.000x, so the checkpoint pair's ratio above it is the saves' cost"
                         if loop.lo <= 1.0 <= loop.hi else ""))
    sec.notes.append(save_cpu_note(runs["save"], size))
    free = ratio_row(sec, f"{VARIANTS['trainloop']}, 1 process (a core free)", runs["save1"], "mean")
    sec.notes.append(f"the checkpoint pair in 1 process, so that a core is free for the background write as on a GPU "
                     f"node: TrainLoop {free.text()} of the hand-written loop with torch.save ({free.pairs} block "
                     f"pairs in {free.launches} launches): the save's extra CPU costs the step only where no core is "
                     "free, as with 2 ranks on this 2-core machine")
    sec.notes += [
        f"MLP 512-1024-1024-10, batch {BATCH} per rank, SGD with momentum, loss averaged over ranks every "
        f"step; {WORLD} local processes with one thread each, gloo over 127.0.0.1",
        f"both variants of a pair train in the same two processes, in alternating blocks (A B, B A, ...; one "
        f"warm-up block each, dropped): {(steps or (blocks, size))[1]} steps, {(steps or (blocks, size))[0]} "
        f"block pairs per launch and {(steps or (0, 0, launches))[2]} launches without checkpoints, {size} steps, "
        f"{blocks} pairs and {launches} launches with them; B first (and built first) in every other launch: a "
        "change of load hits both alike. The ratio is the sum over block pairs of hpc's block statistic over the hand-written one's (median step "
        "per block; mean per block for the checkpoint pair, since a save lands in one step of "
        f"{SAVE_EVERY}); the interval is a two-level bootstrap (launches, then block pairs, "
        f"{BOOTSTRAP} resamples). A target counts as met only when the whole interval is at or below it",
        f"checkpoint pair: model and optimizer every {SAVE_EVERY} steps (TrainLoop also the data position "
        "and RNG states, written in the background, and its stop vote about every 0.1 s); a background write "
        "still running at the end of a TrainLoop block is waited for inside that block", PROFILE_NOTE,
        save_profile_note(), crc_note(WORLD)] + repeated_note(repeated)
    return sec


def save_cpu_note(runs: List[dict], size: int) -> str:
    """Rank 0's CPU per save in each arm of the checkpoint pair: its main thread, and its other
    threads (gloo's, and TrainLoop's checkpoint writer), per block of `size` steps."""
    saves = size / SAVE_EVERY

    def per_block(arm: str) -> tuple:
        blocks = [c for run in runs for c in run.get("cpu", {}).get(arm, [])]
        if not blocks:
            return 0.0, 0.0
        return mean(t for _, t in blocks), mean(p - t for p, t in blocks)

    (main_a, other_a), (main_b, other_b) = per_block("torch"), per_block("hpc")
    wall = {arm: mean(sum(blk) for run in runs for blk in run[arm]) for arm in ("torch", "hpc")}
    return (f"CPU of rank 0 per block of {size} steps ({saves:g} saves), checkpoint pair: hand-written "
            f"{fmt_s(main_a)} in the training thread (torch.save included) and {fmt_s(other_a)} in other threads "
            f"(gloo's); TrainLoop {fmt_s(main_b)} and {fmt_s(other_b)} (its checkpoint writer's too). TrainLoop "
            f"uses {fmt_s((main_b + other_b - main_a - other_a) / saves)} more CPU per save and its block takes "
            f"{fmt_s((wall['hpc'] - wall['torch']) / saves)} longer per save: with 2 ranks on 2 cores no core is idle, "
            "so every millisecond a background write computes is taken from training; on a GPU node, where "
            "the training thread mostly waits for the device, the same write costs the step nothing")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ddp_overhead")
    p.add_argument("--pair", choices=("session", "save", "save1", "control", "loop"), required=True)
    p.add_argument("--blocks", type=int, default=BLOCKS, help="block pairs after the warm-up blocks")
    p.add_argument("--block-steps", type=int, default=2 * SAVE_EVERY)
    p.add_argument("--b-first", action="store_true", help="hpc's block first in each pair")
    p.add_argument("--only", choices=("torch", "hpc"), default="", help="train this arm only (bench.profile)")
    p.add_argument("--out", required=True, help="directory for the checkpoints")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    emit(child(a.pair, a.blocks, a.block_steps, a.out, a.b_first, a.only))


if __name__ == "__main__":
    main()
