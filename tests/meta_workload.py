"""A model built on the meta device, wrapped by s.wrap(strategy=...), in every task of a local group.

    python tests/meta_workload.py OUT --strategy fsdp --blocks 16 --width 2048 --steps 4

Builds ``--blocks`` residual blocks of ``Linear(width, width)`` under ``torch.device("meta")``
(no memory), wraps them (FSDP: shard, then ``to_empty`` and ``reset_parameters`` on the shards),
then trains a few SGD steps on one fixed batch. Every rank writes OUT/rank-<r>.json with the
resident memory growth from just before ``wrap`` (after a warm-up) to the peak just after it (from /proc/self/statm
and getrusage's ru_maxrss), the model's full size, this rank's parameter elements, whether every
weight lies within its ``reset_parameters`` bound (uninitialised memory would not), and the losses.
Rank 0 saves the initialised model, gathered whole, as OUT/initial.pt (seed 0, set after warm-up).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
from pathlib import Path

import torch

import hpc.ddp


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class Deep(torch.nn.Module):
    def __init__(self, blocks: int, width: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Start the peak (VmHWM) over from the current resident size: ru_maxrss keeps the peak of the
    whole process life, which an earlier, since freed, allocation may have set above `before`."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # an older kernel: the lifetime peak stands in, an upper bound


def peak_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def warm_up(s) -> None:
    """Shard and initialise a tiny meta model first: the code FSDP and DTensor load on first use
    (tens of MB of Python modules, once per process) is not the model's memory."""
    from hpc.runtime.fsdp import materialize, shard

    if s.distributed:
        with torch.device("meta"):
            tiny = Deep(2, 8)
        materialize(shard(tiny, s.mesh), s.device)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--strategy", default="fsdp")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    with hpc.ddp.session(timeout_s=120) as s:
        warm_up(s)  # before seeding: its init draws from the generator
        torch.manual_seed(0)
        with torch.device("meta"):
            model = Deep(a.blocks, a.width)
        reset_peak()
        before = rss_bytes()
        model = s.wrap(model, strategy=a.strategy)
        grown = peak_bytes() - before
        bound = 1 / math.sqrt(a.width)  # nn.Linear.reset_parameters: U(-1/sqrt(fan_in), ...)
        in_bounds = all(bool((local(q).abs() <= bound).all()) for q in model.parameters())
        full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
        if s.is_main:
            torch.save(full, a.out / "initial.pt")
        del full
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(4, a.width, generator=gen)
        y = torch.randn(4, a.width, generator=gen)
        losses = []
        for _ in range(a.steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        report = {"grown": grown, "model_bytes": sum(q.numel() * 4 for q in model.parameters()),
                  "unit_bytes": (a.width * a.width + a.width) * 4, "world": s.world_size,
                  "local_numel": sum(local(q).numel() for q in model.parameters()),
                  "numel": sum(q.numel() for q in model.parameters()), "in_bounds": in_bounds,
                  "losses": losses}
        (a.out / f"rank-{s.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
