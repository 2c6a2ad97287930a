"""NCCL workloads the GPU suite runs in processes of their own: NCCL reads its flight recorder
settings once per process, and a timed-out collective ends the process.

    python tests/gpu/nccl_workload.py trace OUT           # one rank: record, then dump as the watchdog does
    python tests/gpu/nccl_workload.py timeout OUT 3       # one rank: a barrier past the training timeout
    RANK=.. WORLD_SIZE=2 ... python tests/gpu/nccl_workload.py ranks OUT   # hpc.ddp.session on 2 GPUs

Each prints one JSON line (or, for timeout, never returns: NCCL's watchdog ends it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onerank import OneRankSession, one_rank_group  # noqa: E402

import hpc.ddp  # noqa: E402
from hpc.recovery.hangs import flight_recorder_env  # noqa: E402
from hpc.recovery.stopsignal import StopFlag, StopVote  # noqa: E402
from hpc.recovery.watchdog import nccl_trace  # noqa: E402
from hpc.trainloop import TrainLoop  # noqa: E402


def trace(out: Path) -> dict:
    """Collectives are recorded, and hpc's watchdog dump writes them under out/nccl/."""
    os.environ.update(flight_recorder_env(out))  # as hpc.ddp.session does before making the group
    with one_rank_group("cuda") as (device, _):
        s = OneRankSession(device)
        total = s.all_reduce_sum(torch.ones(3, device=device))
        torch.cuda.synchronize()
        nccl_trace(out)
        return {"sum": total.tolist(),
                "has_dump": hasattr(torch._C._distributed_c10d, "_dump_nccl_trace")}


def timeout(out: Path, train_timeout_s: float) -> None:
    """A start-up timeout of 600 s, a training timeout of `train_timeout_s`: after
    training_started() a barrier stuck behind a long kernel must end the process within the
    shorter one, and the flight recorder dump lands in out/nccl/."""
    os.environ.update(flight_recorder_env(out))
    with one_rank_group("cuda", timeout_s=600) as (device, _):
        s = OneRankSession(device, timeout_s=600, train_timeout_s=train_timeout_s)
        s.barrier()
        s.training_started()
        print(json.dumps({"armed": time.time()}), flush=True)
        torch.cuda._sleep(int(2e9 * 300))  # the device is busy for minutes: the barrier cannot complete
        s.barrier()
        torch.cuda.synchronize()
        print(json.dumps({"returned": time.time()}), flush=True)


def ranks(out: Path) -> dict:
    """What every rank of a 2-GPU job sees through hpc.ddp.session."""
    import torch.distributed as dist

    with hpc.ddp.session(timeout_s=120) as s:
        result = {"device": str(s.device), "backend": dist.get_backend(),
                  "trace_prefix": os.environ.get("TORCH_FR_DUMP_TEMP_FILE"),
                  "sum": s.all_reduce_sum(float(s.rank + 1)),
                  "mean": s.all_reduce_mean(torch.tensor([float(s.rank)])).tolist()}
        torch.manual_seed(0)
        model = s.wrap(torch.nn.Linear(4, 1))
        result["device_ids"] = model.device_ids
        gen = torch.Generator().manual_seed(s.rank)  # each rank its own batch
        x, y = torch.randn(8, 4, generator=gen).to(s.device), torch.randn(8, 1, generator=gen).to(s.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        result["weights"] = model.module.weight.detach().cpu().flatten().tolist()
        loop = TrainLoop(s, out / "loop", tensorboard=False, watchdog_s=0)
        result["broadcast"] = loop._broadcast({"from": s.rank})
        loop.flag.uninstall()
        loop.store.close()
        flag = StopFlag()
        vote = StopVote(flag, device=s.device)
        vote.poll()
        if s.rank == 1:
            flag.reason, flag.signal = "timeout", "SIGUSR2"
        vote.poll()
        request = vote.poll()
        result["vote"] = request.reason if request else None
        vote.close()
        s.barrier()
    return result


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "trace":
        print(json.dumps(trace(out)), flush=True)
    elif mode == "timeout":
        timeout(out, float(sys.argv[3]))
    else:
        result = ranks(out)
        (out / f"rank-{os.environ['RANK']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
