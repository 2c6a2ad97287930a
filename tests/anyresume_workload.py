"""Any-to-any resume through TrainLoop: save under each strategy at one world size, resume under each.

    python tests/anyresume_workload.py save ROOT      # in every task of a world-W group
    python tests/anyresume_workload.py resume ROOT    # likewise, at another (or the same) W

``save``: for each strategy, TrainLoop trains the tiny float64 Net of fsdp_workload for STEPS steps
in ROOT/src-<strategy>-<W>/ and writes its final checkpoint; rank 0 dumps the full model and
optimizer state beside it (saved.pt). ``resume``: for every source directory and each strategy,
the checkpoints are copied to ROOT/dst-<source>-to-<strategy>-<W>/, TrainLoop resumes from them,
rank 0 dumps the loaded full state (loaded.pt), and one more step trains. One process group per
launch serves every run of that launch, so the 36 pairs cost 6 launches.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from fsdp_workload import Net, dump, run_mode
from hpc.trainloop import TrainLoop

STRATEGIES, STEPS, BATCH = ("ddp", "fsdp"), 2, 4


def build(s, strategy: str):
    torch.manual_seed(0)
    model = s.wrap(Net().double(), strategy=strategy)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def step(s, model, opt, n: int) -> None:
    gen = torch.Generator().manual_seed(100 * n + s.rank)
    x = torch.randn(BATCH, 8, generator=gen, dtype=torch.float64)
    torch.nn.functional.mse_loss(model(x), torch.sin(x.sum(1, keepdim=True))).backward()
    opt.step()
    opt.zero_grad()


def save(s, root: Path) -> None:
    for strategy in STRATEGIES:
        out = root / f"src-{strategy}-{s.world_size}"
        model, opt = build(s, strategy)
        with TrainLoop(s, out, tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt})
            for n in loop.steps(STEPS):
                step(s, model, opt, n)
        dump(s, model, opt, out / "saved.pt")


def resume(s, root: Path) -> None:
    for source in sorted(p for p in root.glob("src-*") if (p / "saved.pt").is_file()):
        for strategy in STRATEGIES:
            out = root / f"dst-{source.name[4:]}-to-{strategy}-{s.world_size}"
            if s.is_main:
                shutil.copytree(source / "checkpoints", out / "checkpoints")
            s.barrier()
            model, opt = build(s, strategy)
            with TrainLoop(s, out, tensorboard=False) as loop:
                resumed = loop.resume({"model": model, "optimizer": opt})
                assert resumed == STEPS, f"{out}: resumed from step {resumed}"
                dump(s, model, opt, out / "loaded.pt")
                for n in loop.steps(STEPS + 1):
                    step(s, model, opt, n)


if __name__ == "__main__":
    run_mode({"save": save, "resume": resume})
