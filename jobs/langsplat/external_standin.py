"""Stand-in for LangSplat's train.py / train_ddp.py: same arguments, checkable output, no training.

    python -m hpc.jobs.langsplat.external_standin -s data/scene -m out/scene --iterations 30000
    python -m hpc.launch -- python -m hpc.jobs.langsplat.external_standin -s data/scene -m out/scene_1 \
        --start_checkpoint out/scene/chkpnt30000.pth --feature_level 1 --iterations 30000

It tests external mode (templates/langsplat_external.yaml) without a LangSplat checkout. Like the
real scripts it reads the DDP variables torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); with more than one rank it joins a gloo process group
and all-reduces its rank, proving the rendezvous worked. Each rank writes
<model>/standin/rank-<R>.json (arguments, DDP variables, the all-reduced rank sum); rank 0 writes
a small JSON file where the real script writes its checkpoint: <model>/chkpnt<iterations>.pth.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

DDP_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-s", "--source_path", required=True)
    p.add_argument("-m", "--model_path", required=True)
    p.add_argument("--start_checkpoint", default=None)
    p.add_argument("--feature_level", type=int, default=-1)
    p.add_argument("--iterations", type=int, default=30000)
    p.add_argument("--include_feature", action="store_true")
    p.add_argument("--no_include_feature", dest="include_feature", action="store_false")
    # LangSplat has many more options (--port, --eval, --test_iterations ...): accept them all.
    args, args.unknown = p.parse_known_args(argv)
    return args


def _rank_sum(rank: int, world: int) -> int:
    if world == 1:
        return rank
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                            f"{os.environ['MASTER_PORT']}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        t = torch.tensor([rank])
        dist.all_reduce(t)
        return int(t)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.feature_level >= 0:
        if not args.start_checkpoint or not Path(args.start_checkpoint).is_file():
            print(f"error: --start_checkpoint {args.start_checkpoint!r} is not a file; feature "
                  "training starts from the RGB stage's checkpoint. HINT: run the rgb command first "
                  "and pass its <model>/chkpnt<iterations>.pth", file=sys.stderr)
            return 2
    total = _rank_sum(rank, world)
    model = Path(args.model_path)
    (model / "standin").mkdir(parents=True, exist_ok=True)
    record = {"args": {k: v for k, v in vars(args).items()}, "rank_sum": total,
              "env": {v: os.environ.get(v) for v in DDP_VARIABLES}}
    (model / "standin" / f"rank-{rank}.json").write_text(json.dumps(record, indent=1))
    if rank == 0:
        (model / f"chkpnt{args.iterations}.pth").write_text(json.dumps(
            {"feature_level": args.feature_level, "world_size": world, "from": args.start_checkpoint}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
