"""Which device a task of a distributed job binds, and what `python -m hpc.env` reports about it.

No torch import unless asked (`describe(..., probe_torch=True)`).
"""

from __future__ import annotations

from hpc.runtime.distenv import DistEnv, EnvError


def bind_device(env: DistEnv, device_count: int | None = None) -> tuple[int | None, str | None]:
    """(CUDA ordinal for this task or None for the CPU, warning or None).

    device_count is what torch.cuda.device_count() says (None: not asked, so SLURM's
    CUDA_VISIBLE_DEVICES alone counts). Where CUDA_VISIBLE_DEVICES is unset (torchrun, sites
    that do not bind GPUs through gres) the count alone decides. One GPU: cuda:0 (SLURM gave
    this task its own). As many GPUs as tasks on the node: cuda:LOCAL_RANK. More GPUs than
    tasks: cuda:LOCAL_RANK with a warning (model parallelism inside a task is legitimate).
    Fewer GPUs than tasks, but more than one, is an error: tasks would share GPUs.
    """
    allocated = len(env.visible_devices)
    usable = allocated if device_count is None else device_count
    gpus = usable or allocated  # SLURM's allocation is checked even where CUDA is missing
    tasks = env.local_world_size
    if gpus <= 1:
        return (0 if usable == 1 else None), None
    if gpus < tasks:
        raise EnvError(
            f"{tasks} tasks on this node but {gpus} GPUs visible to each: tasks per node must "
            f"not exceed GPUs per node. HINT: use --ntasks-per-node={gpus}, or --gpus-per-task=1 "
            "so each task sees its own GPU"
        )
    warning = None
    if gpus > tasks:
        who = "world size 1" if env.world_size == 1 else f"{tasks} tasks on this node"
        warning = (f"{who} but {gpus} GPUs visible: each task binds cuda:LOCAL_RANK, and "
                   f"{gpus - tasks} GPUs get no work unless the program spreads a model over "
                   f"them. HINT: run one task per GPU (--ntasks-per-node={gpus}) to use them all")
    return (env.local_rank if usable else None), warning


def device_index(env: DistEnv, device_count: int | None = None) -> int | None:
    """bind_device without the warning."""
    return bind_device(env, device_count)[0]


def describe(env: DistEnv, probe_torch: bool = False) -> dict:
    """What `python -m hpc.env` prints: the parsed fields plus device, backend and a warning."""
    count = None
    if probe_torch:
        import torch  # only on request: the basic answer stays torch-free and fast

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index, warning = bind_device(env, count)
    info = env.to_dict()
    info["visible_devices"] = list(env.visible_devices)
    info["hosts"] = list(env.hosts)
    info["device"] = "cpu" if index is None else f"cuda:{index}"
    info["backend"] = "gloo" if index is None else "nccl"
    info["warning"] = warning
    return info
