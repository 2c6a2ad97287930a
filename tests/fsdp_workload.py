"""Workloads of the FSDP and DCP tests, run in every task of a torchrun-style local group.

    python tests/fsdp_workload.py train OUT --strategy fsdp --steps 5 --save-at 3
    python tests/fsdp_workload.py resume OUT --strategy ddp --ckpt OUT/ckpt --start 3 --steps 5
    python tests/fsdp_workload.py train OUT --strategy fsdp --save-at 3 --no-collectives  # then merged

Each optimizer step sees the same global batch of a fixed float64 data set at any world size,
split evenly over the ranks (and, with --accum K, into K micro-batches per rank). Rank 0 writes
full (unsharded) model and optimizer states as OUT/<name>.pt so that the test can compare runs of
different world sizes and strategies; every rank writes OUT/rank-<r>.json: how many parameter
elements it holds, and whether FSDP produced sharded gradients (that is, reduce-scattered) before
the last micro-batch: inside s.no_sync_if it must not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import hpc.ddp
from hpc.checkpoint.dcp_engine import DcpEngine, state_dicts
from hpc.checkpoint.staging import tensors_in

GLOBAL_BATCH = 12  # splits evenly over 1, 2, 3 and 4 ranks


class Net(torch.nn.Module):
    """An input layer, a list of blocks (FSDP's units) and a one-row head (uneven shards)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 12)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(12, 12), torch.nn.Tanh()) for _ in range(2))
        self.out = torch.nn.Linear(12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build(s, strategy: str):
    torch.manual_seed(0)
    model = s.wrap(Net().double(), strategy=strategy)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(GLOBAL_BATCH * steps, 8, generator=gen, dtype=torch.float64)
    return x, torch.sin(x.sum(1, keepdim=True))


def train_step(s, model, opt, x, y, step: int, accum: int = 1) -> bool:
    """One optimizer step; True when a parameter had a .grad before the last micro-batch."""
    share = GLOBAL_BATCH // s.world_size
    micro = share // accum
    early = False
    for k in range(accum):
        lo = step * GLOBAL_BATCH + s.rank * share + k * micro
        with s.no_sync_if(k < accum - 1):
            loss = torch.nn.functional.mse_loss(model(x[lo:lo + micro]), y[lo:lo + micro])
            (loss / accum).backward()
        if k < accum - 1:
            early |= any(p.grad is not None for p in model.parameters())
    opt.step()
    opt.zero_grad()
    return early


def dump(s, model, opt, path: Path) -> None:
    """The full state on rank 0 (a collective: every rank calls)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, opt, options=full)
    if s.is_main:
        torch.save({"model": model_sd, "optimizer": optim_sd}, path)


def train(s, a) -> None:
    model, opt = build(s, a.strategy)
    x, y = data(a.steps)
    early = False
    staged = state_bytes = plain_bytes = None
    with DcpEngine(s) as engine:
        for step in range(a.steps):
            early |= train_step(s, model, opt, x, y, step, a.accum)
            if step + 1 == a.save_at:
                dump(s, model, opt, a.out / "saved.pt")
                # Asynchronous: the next steps change the parameters while the thread writes.
                engine.save(a.out / "ckpt", model, opt, blocking=a.blocking,
                            collectives=not a.no_collectives)
                staged = engine.staged_bytes
                tensors = list(tensors_in(state_dicts(model, opt)))
                state_bytes = sorted(t.numel() * t.element_size() for t in tensors)
                plain_bytes = sum(t.numel() * t.element_size() for t in tensors if not hasattr(t, "to_local"))
    dump(s, model, opt, a.out / "final.pt")
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    report = {"local_numel": local, "numel": sum(p.numel() for p in model.parameters()),
              "grads_before_last_micro_batch": early, "staged_bytes": staged, "state_bytes": state_bytes,
              "plain_bytes": plain_bytes}
    (a.out / f"rank-{s.rank}.json").write_text(json.dumps(report))


def resume(s, a) -> None:
    model, opt = build(s, a.strategy)
    x, y = data(a.steps)
    with DcpEngine(s) as engine:
        engine.load(a.ckpt, model, opt)
    dump(s, model, opt, a.out / "loaded.pt")
    for step in range(a.start, a.steps):
        train_step(s, model, opt, x, y, step)
    dump(s, model, opt, a.out / "final.pt")


def run_mode(modes: dict) -> None:
    """`python WORKLOAD MODE ROOT` in every task of a group: `modes[MODE](s, ROOT)` in one session;
    a dict it returns is written to ROOT/MODE-RANK.json."""
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=sorted(modes))
    p.add_argument("root", type=Path)
    a = p.parse_args()
    with hpc.ddp.session(timeout_s=120) as s:
        result = modes[a.mode](s, a.root)
        if result is not None:
            (a.root / f"{a.mode}-{s.rank}.json").write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "resume"])
    p.add_argument("out", type=Path)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--blocking", action="store_true")
    p.add_argument("--no-collectives", action="store_true")
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--ckpt", type=Path)
    p.add_argument("--start", type=int, default=0)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    with hpc.ddp.session(timeout_s=120) as s:
        {"train": train, "resume": resume}[a.mode](s, a)


if __name__ == "__main__":
    main()
