"""Stand-in for the fork's train_ddp.py: one feature level on many ranks, one camera per rank a step.

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        python tests/langsplat_standins/train_ddp.py -s data/scene -m out/scene --feature_level 1 \
        --start_checkpoint out/rgb/chkpnt30000.pth --dist_backend gloo

Ranks from RANK/WORLD_SIZE/LOCAL_RANK, else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, else one
process; init_process_group by env:// (MASTER_ADDR/MASTER_PORT needed in both branches), then
set_device(LOCAL_RANK). Needs at least as many cameras as ranks. --epochs E trains
E * (cameras // ranks) iterations; otherwise --match_single_gpu_updates multiplies --iterations (and
so the last checkpoint's name) by the world size; --scale_lr multiplies the feature lr by it.
Binds no GUI port. Rank 0 writes cfg_args and the 13-entry checkpoints.
"""
from __future__ import annotations

import os
import sys
from argparse import ArgumentParser
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.langsplat_standins import common as c
from tests.langsplat_standins.train import model_values, save, start, step


def parse(argv):
    p = ArgumentParser(description="LangSplat DDP Training")
    for group in (c.MODEL_LANGSPLAT, c.OPT_LANGSPLAT, c.PIPE):
        c.add_group(p, group, fork=True)
    c.train_flags(p, 55555, [7000, 30000])
    p.add_argument("--dist_backend", type=str, default="nccl")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--scale_lr", action="store_true", default=False)
    p.add_argument("--match_single_gpu_updates", action="store_true", default=False)
    return p.parse_args(argv)


def setup_distributed(backend: str):
    import torch
    import torch.distributed as dist

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    elif "SLURM_PROCID" in os.environ:
        rank, world, local = (int(os.environ[v]) for v in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))
    else:
        return 0, 0, 1
    dist.init_process_group(backend=backend, rank=rank, world_size=world)  # env:// reads MASTER_*
    set_device(local)
    return rank, local, world


def set_device(local_rank: int) -> None:
    """torch.cuda.set_device(LOCAL_RANK); without CUDA, the same check on CUDA_VISIBLE_DEVICES."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if visible and local_rank >= len(visible):
        raise RuntimeError(f"CUDA error: invalid device ordinal (LOCAL_RANK={local_rank}, "
                           f"CUDA_VISIBLE_DEVICES={','.join(visible)})")


def main(argv=None) -> int:
    import torch
    import torch.distributed as dist

    args = parse(sys.argv[1:] if argv is None else argv)
    args.include_feature = True
    rank, _, world = setup_distributed(args.dist_backend)
    if args.match_single_gpu_updates and args.epochs is None:
        args.iterations *= world
    lr_scale = world if args.scale_lr else 1
    if args.epochs is None:
        args.save_iterations.append(args.iterations)
    args.model_path = args.model_path + f"_{args.feature_level}"
    if rank == 0:
        c.write_cfg_args(args.model_path, model_values(args, c.MODEL_LANGSPLAT))
    if world > 1:
        dist.barrier()
    scene = c.Scene(args.source_path, args.images)
    g, first = start(args, scene, True, "fork")
    cameras = len(scene.names)
    if cameras < world:
        raise ValueError(f"Number of cameras ({cameras}) is less than world_size ({world}). "
                         "Reduce world_size to use drop_last sampling.")
    per_epoch = cameras // world
    if args.epochs is not None:
        args.iterations = args.epochs * per_epoch
        args.save_iterations.append(args.iterations)
    if rank == 0:
        c.record(args.model_path, script="train_ddp.py", start_iteration=first + 1, iterations=args.iterations,
                 world_size=world, start_checkpoint=args.start_checkpoint, lr_scale=lr_scale,
                 omp_num_threads=os.environ.get("OMP_NUM_THREADS"))
    for it in range(first + 1, args.iterations + 1):
        if it == first + 1:
            c.first_render("fork", *scene.size(scene.names[0]), True)
        epoch, k = divmod(it - 1, per_epoch)
        order = torch.randperm(cameras, generator=torch.Generator().manual_seed(epoch)).tolist()
        before = g["language_feature"].copy()
        step(g, scene, args, scene.names[order[k * world + rank]], True, lr_scale)
        if world > 1:  # average the update over the ranks, as the gradient all-reduce does
            delta = torch.from_numpy(g["language_feature"] - before)
            dist.all_reduce(delta)
            g["language_feature"] = before + delta.numpy() / world
        if rank == 0:
            save(args, g, it, True)
        if world > 1:
            dist.barrier()
        c.hold(it)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
