"""What each rank reads at a commit and at a resume: /proc/self/io around TrainLoop's own calls.

    python tests/rankreads_workload.py save ROOT     # in every task of a 2-rank gloo group
    python tests/rankreads_workload.py resume ROOT

``save``: an FSDP model trains 3 steps with checkpoints at steps 2 and 3; the bytes each rank read
(rchar: every read call, page cache or disk) while its blocking save of step 3 committed go to
ROOT/reads-<rank>.json, with the names of the files it opened. ``resume``: the same for TrainLoop.resume; then rank 0 corrupts one byte of
rank 1's shard of step 3, and a second resume (every rank) must go back to step 2, the ranks
agreeing although only rank 1 reads that file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fsdp_workload import run_mode
from hpc.trainloop import TrainLoop

WIDTH, BLOCKS = 512, 4  # 1 MiB of float32 weights per block; Adam state doubles it twice over


def rchar() -> int:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


OPENED: list[str] | None = None  # names of the files open() met while a commit or a resume ran


def _audit(event: str, args: tuple) -> None:
    if event == "open" and OPENED is not None and isinstance(args[0], (str, Path)):
        OPENED.append(Path(args[0]).name)


sys.addaudithook(_audit)  # no way to remove one: it records only while OPENED is a list


def build(s):
    torch.manual_seed(0)
    net = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(BLOCKS)))
    model = s.wrap(net, strategy="fsdp")
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def train(model, opt) -> None:
    model(torch.randn(4, WIDTH)).sum().backward()
    opt.step()
    opt.zero_grad()


def save(s, root: Path) -> dict:
    model, opt = build(s)
    with TrainLoop(s, root, save_every=2, tensorboard=False) as loop:
        loop.resume({"model": model, "optimizer": opt})
        for _ in loop.steps(3):
            train(model, opt)
        loop.store.wait()
        global OPENED
        before, OPENED = rchar(), []
        try:
            loop.save(blocking=True)
        finally:
            opened, OPENED = OPENED, None
        return {"commit": rchar() - before, "commit_opened": opened}


def resumed(s, root: Path) -> tuple[int, int, list[str]]:
    """(step resumed from, bytes read by the resume, names of the files it opened, and one
    "new process group" per group it made)."""
    global OPENED
    model, opt = build(s)
    real, groups = dist.new_group, []

    def counted(*args, **kwargs):
        groups.append(1)
        return real(*args, **kwargs)
    with TrainLoop(s, root, tensorboard=False) as loop:
        before, OPENED, dist.new_group = rchar(), [], counted
        try:
            step = loop.resume({"model": model, "optimizer": opt})
        finally:
            (opened, OPENED), dist.new_group = (OPENED, None), real
        return step, rchar() - before, opened + ["new process group"] * len(groups)


def resume(s, root: Path) -> dict:
    resumed(s, root)  # the first load imports modules: their reads are no checkpoint's
    first, read, opened = resumed(s, root)
    if s.is_main:
        shard = root / "checkpoints" / "step-3" / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    s.barrier()
    second = resumed(s, root)[0]
    return {"resume": read, "first": first, "second": second, "opened": opened}


if __name__ == "__main__":
    run_mode({"save": save, "resume": resume})
