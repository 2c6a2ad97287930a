"""FSDP step time: hpc (s.wrap(model, strategy="fsdp") in hpc.ddp.session, and the same inside a
TrainLoop that saves no checkpoint) against hand-written FSDP2 (fully_shard over
init_device_mesh) on the same model, data and sharding units; gloo, 2 ranks on this machine.

    python -m bench --only fsdp
    RANK=0 ... python -m bench.fsdp_step --pair hpc --out DIR   # one rank (torchrun-style env)

Each launch starts WORLD processes (bench.ranks) that train hand-written FSDP2 and one hpc variant
in alternating blocks of steps (bench.interleave, as bench.ddp_overhead); the median step per
block is compared. A step's time runs from the top of one step to the top of the next, so
TrainLoop's stop vote is in it. A control pair (hand-written FSDP2 against a second copy of
itself) shows how wide an interval this machine's load makes around no difference at all.
"""
from __future__ import annotations

import argparse
from typing import List

from bench.common import Context, emit
from bench.ddp_overhead import HEADERS, PROFILE_NOTE, _sgd, batches_by_hand, init_by_hand, measure, rows, stepper
from bench.interleave import Arm, built_in_order, paired_ratio, pooled, run_blocks
from bench.ranks import WORLD, repeated_note, run_ranks
from bench.report import Section

TARGET = 1.02
# launches per pair, block pairs per launch, steps per block: blocks of a few steps, as the DDP
# section's pairs without checkpoints (bench.ddp_overhead.STEP_BLOCK). The ratios are read against
# 1.02 within about a per cent: 16 launches, as the DDP session pair (the interval narrows with the
# square root of the launches), and the same for every pair, the control's included, so that the
# control's interval is the others' resolution
LAUNCHES, BLOCKS, BLOCK_STEPS = 16, 40, 4
BATCH = 32
WIDTH, BLOCKS_NET = 512, 4
VARIANTS = {"torch": "hand-written FSDP2 (fully_shard per block, then the root)",
            "hpc": 's.wrap(model, strategy="fsdp")',
            "trainloop": 's.wrap(model, strategy="fsdp") in TrainLoop, no checkpoint',
            "control": "control: hand-written FSDP2, a second copy"}


def model_and_data(width: int = WIDTH, blocks: int = BLOCKS_NET):
    """A transformer-shaped MLP: an input layer, a ModuleList of blocks (FSDP's units), a head."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(64, width)
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(blocks))
            self.head = torch.nn.Linear(width, 10)

        def forward(self, x):
            x = self.inp(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    return Net(), data


def hand_written(world: int) -> Arm:
    """A 1-D mesh, fully_shard per block then the root, DistributedSampler, an all_reduce of the loss."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, DistributedSampler

    model, data = model_and_data()
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sampler = DistributedSampler(data, num_replicas=world, rank=dist.get_rank(), shuffle=True, seed=0,
                                 drop_last=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)

    def reduce_mean(t):
        dist.all_reduce(t)
        return t / world

    return Arm("torch", stepper(model, _sgd(model), batches_by_hand(loader, sampler), reduce_mean))


def with_hpc(s, stack, out: str, trainloop: bool, total: int) -> Arm:
    from hpc.trainloop import TrainLoop

    model, data = model_and_data()
    model = s.wrap(model, strategy="fsdp")
    opt = _sgd(model)
    loader = s.loader(data, batch_size=BATCH, seed=0)
    ticks = None
    if trainloop:
        loop = stack.enter_context(TrainLoop(s, out, save_every=10**9, tensorboard=False))
        loop.resume({"model": model, "optimizer": opt, "data": loader})
        ticks = iter(loop.steps(total))
    return Arm("hpc", stepper(model, opt, loader.batches(), s.all_reduce_mean, ticks=ticks))


def child(pairs: List[str], blocks: int, size: int, out: str, b_first: bool, only: str = "") -> dict:
    """The block times of one pair; of several (a quick run's), {pair: times}, the pairs in turn."""
    import contextlib

    import torch.distributed as dist

    import hpc.ddp

    _, world = init_by_hand()
    try:
        with contextlib.ExitStack() as stack:
            s = stack.enter_context(hpc.ddp.session(timeout_s=120))  # finds the group made above

            def build_b(pair: str) -> Arm:
                if pair == "control":  # hand-written against a second copy of itself
                    return Arm("hpc", hand_written(world).step)
                return with_hpc(s, stack, f"{out}/{pair}" if len(pairs) > 1 else out, pair == "trainloop",
                                total=(blocks + 1) * size + 1)

            times = {}
            for pair in pairs:
                a, b = built_in_order(lambda: hand_written(world), lambda: build_b(pair), b_first)
                times[pair] = run_blocks(a, b, blocks, size, b_first, only)
        # Tearing gloo down while the peer is still in its last collectives aborted a rank at
        # exit here ("terminate called without an active exception"): leave together.
        dist.barrier()
        return times if len(pairs) > 1 else times[pairs[0]]
    finally:
        dist.destroy_process_group()


def run(ctx: Context) -> Section:
    launches, blocks, size = (1, 1, 5) if ctx.quick else (ctx.launches or LAUNCHES, BLOCKS, BLOCK_STEPS)
    sec = Section("fsdp", "FSDP step time (gloo, 2 ranks)",
                  f"hpc FSDP step time <= {TARGET} x hand-written FSDP2 (median)",
                  "python -m bench --only fsdp" + (" --quick" if ctx.quick else "") +
                  (f" --launches {ctx.launches}" if ctx.launches and not ctx.quick else ""), headers=HEADERS)
    repeated: List[str] = []
    # The control pair tells how wide an interval around 1.000x this load makes; a quick run skips it.
    pairs = {"hpc": None, "trainloop": None, **({} if ctx.quick else {"control": None})}
    if ctx.quick:  # a smoke test: both pairs in turn in one launch (one start-up)
        out = ctx.scratch("fsdp_step-quick")
        args = ["--pair", *pairs, "--blocks", str(blocks), "--block-steps", str(size), "--out", str(out)]
        runs = {p: [times] for p, times in run_ranks("fsdp_step", args, out, "fsdp_step quick", repeated).items()}
    else:
        runs = measure(ctx, "fsdp_step", pairs, launches, blocks, size, repeated)
    for pair in ("hpc", "trainloop"):
        rows(sec, {"torch": VARIANTS["torch"], "hpc": VARIANTS[pair]}, runs[pair], "median", TARGET)
    if "control" in runs:
        control = paired_ratio(runs["control"], "torch", "hpc", "median")
        sec.rows.append([VARIANTS["control"], "", "", "", str(len(pooled(runs["control"], "hpc"))), control.text(),
                         f"{control.p90_ratio:.3f}x"])
        sec.notes.append(
            f"control: hand-written FSDP2 against a second copy of itself, measured as the other pairs are "
            f"({blocks} block pairs in each of {launches} launches): {control.text()}; an interval this wide "
            "around 1.000x is the method's resolution at this load, and a ratio inside the control's interval is "
            "a difference this machine cannot tell from none")
    sec.notes += [
        f"MLP 64-{WIDTH} then {BLOCKS_NET} blocks of {WIDTH}x{WIDTH} (each an FSDP unit, as hpc.runtime.fsdp shards a "
        f"ModuleList's elements) then a 10-way head; batch {BATCH} per rank, SGD with momentum, loss averaged "
        f"over ranks every step; {WORLD} local processes with one thread each, gloo over 127.0.0.1",
        f"hand-written FSDP2 and one hpc variant train in the same two processes, in alternating blocks of "
        f"{size} steps, {blocks} block pairs per launch, "
        + ("both pairs in turn in one launch" if ctx.quick else f"{launches} launches per pair")
        + ", B first (and built first) in every other launch (bench.interleave, as the DDP section, whose "
        "control pair shows the method's resolution); hand-written data comes from DistributedSampler, hpc's "
        "from s.loader (its resumable loader); a target counts as met only when the whole 95% interval is at "
        "or below it",
        PROFILE_NOTE] + repeated_note(repeated)
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fsdp_step")
    p.add_argument("--pair", nargs="+", choices=("hpc", "trainloop", "control"), required=True,
                   help="several (--quick): each in turn, one result per pair")
    p.add_argument("--blocks", type=int, default=BLOCKS)
    p.add_argument("--block-steps", type=int, default=BLOCK_STEPS)
    p.add_argument("--b-first", action="store_true", help="hpc's block first in each pair")
    p.add_argument("--only", choices=("torch", "hpc"), default="", help="train this arm only (bench.profile)")
    p.add_argument("--out", required=True, help="TrainLoop's directory")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    emit(child(a.pair, a.blocks, a.block_steps, a.out, a.b_first, a.only))


if __name__ == "__main__":
    main()
