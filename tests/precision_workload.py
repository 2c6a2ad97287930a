"""What an FSDP model computes in, seen from inside its forward: 2 gloo ranks on the CPU.

    python tests/precision_workload.py OUT       (as each rank of a local group)

The session asks for bf16 (hpc.ddp.session(bf16=True)); on the CPU it keeps fp32. A second Session
on the same group is bound to cuda:0 with bf16, as a CUDA task's session is, and shards over the
CPU mesh (no CUDA here: nothing touches the device). Forward hooks on every Linear record the
dtypes of its input, its weight and its output while it runs; after one backward, the gradients'
dtype, and whether they were reduced in fp32 (bf16 sums would all be bf16 values). Every rank feeds
its own batch, so the two ranks' gradients differ. Rank 0 writes OUT/report.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import hpc.ddp
from hpc.runtime.session import Session


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(2))
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def observe(session: Session, rank: int) -> dict:
    torch.manual_seed(0)
    model = Net()
    seen: list[list[str]] = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(
                lambda m, args, out: seen.append([str(args[0].dtype), str(m.weight.dtype), str(out.dtype)]))
    model = session.wrap(model, strategy="fsdp")
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1 + rank))
    model(x).float().pow(2).mean().backward()
    grads = [p.grad.to_local() for p in model.parameters()]
    return {"forward": seen,
            "shards": sorted({str(p.dtype) for p in model.parameters()}),
            "grads": sorted({str(g.dtype) for g in grads}),
            "fp32_sums": any(not torch.equal(g, g.bfloat16().float()) for g in grads)}


def main() -> None:
    out = Path(sys.argv[1])
    with hpc.ddp.session(timeout_s=60, bf16=True) as s:
        cuda_task = Session(s.env, torch.device("cuda", 0), bf16=True)
        cuda_task._mesh = s.mesh  # the mesh a CUDA task's session would build, on the CPU
        report = {"cpu": observe(s, s.rank), "cuda": observe(cuda_task, s.rank)}
        if s.is_main:
            out.mkdir(parents=True, exist_ok=True)
            (out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
