"""The distributed environment of this process, parsed once into a frozen DistEnv.

    python -m hpc.env [--json] [--torch]

Three sources, tried in order: a torchrun-style launcher (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), a SLURM task started by srun (SLURM_PROCID, ...), or a single
process. `from_environ` is pure (give it a dict); `DistEnv.export` is the only writer of
os.environ. No torch import here: `python -m hpc.env` answers in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import Mapping, MutableMapping

from hpc.hostlist import expand

__all__ = ["DistEnv", "EnvError", "from_environ", "master_port_for", "device_index", "main"]

# MASTER_PORT is derived in [PORT_BASE, PORT_BASE + PORT_SPAN): unprivileged, and below
# Linux's ephemeral range (32768+) so an outgoing connection cannot be holding it already.
PORT_BASE, PORT_SPAN = 20000, 12000
SINGLE_PORT = 29500  # torchrun's default, for a lone process

# Variables each source must define completely; a partial set is an error naming the rest.
TORCHRUN_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TORCHRUN_TRIGGERS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")  # MASTER_PORT alone is an override
SLURM_REQUIRED = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_JOB_ID")
# (field, candidate names): srun sets SLURM_STEP_* for its step; the job-wide names cover the rest.
SLURM_ALTERNATIVES = {
    "nodelist": ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "num_nodes": ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
}


class EnvError(RuntimeError):
    """The environment does not describe a coherent distributed job."""


@dataclass(frozen=True)
class DistEnv:
    source: str  # 'slurm' | 'torchrun' | 'single'
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_id: str | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None
    restart_count: int = 0
    visible_devices: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def export(self, target: MutableMapping[str, str] | None = None) -> dict[str, str]:
        """Write the torchrun variables (what env:// init and torchrun scripts read)."""
        values = {
            "RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
        }
        (os.environ if target is None else target).update(values)
        return values

    def to_dict(self) -> dict:
        return asdict(self)


def _int(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise EnvError(f"{name}={text!r} is not an integer. HINT: unset or fix {name}") from None


def _missing(env: Mapping[str, str], names) -> list[str]:
    return [n for n in names if not env.get(n)]


def _first_name(env: Mapping[str, str], names) -> str | None:
    return next((n for n in names if env.get(n)), None)


def _first(env: Mapping[str, str], names) -> str | None:
    name = _first_name(env, names)
    return env[name] if name else None


def parse_tasks_per_node(text: str) -> list[int]:
    """SLURM's compressed count list: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise EnvError(f"tasks-per-node value {text!r} not understood; expected e.g. '2(x3),1'")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def master_port_for(job_id: str | None, array_job_id: str | None = None,
                    array_task_id: int | None = None) -> int:
    """Same on every node of a job, different for concurrent jobs and array tasks."""
    if array_job_id is not None and array_task_id is not None:
        key = int(array_job_id) * 7 + array_task_id  # consecutive tasks -> consecutive ports
    elif job_id is not None:
        key = int(job_id)
    else:
        return SINGLE_PORT
    return PORT_BASE + key % PORT_SPAN


def _port_override(env: Mapping[str, str]) -> int | None:
    name = "HPC_MASTER_PORT" if env.get("HPC_MASTER_PORT") else "MASTER_PORT"
    if not env.get(name):
        return None
    port = _int(env, name)
    if not 1024 <= port <= 65535:
        raise EnvError(f"{name}={port} is outside 1024-65535. HINT: pick an unprivileged port")
    return port


def _job_fields(env: Mapping[str, str]) -> dict:
    """Job metadata, read whatever the launcher: ids, restarts, GPUs."""
    restarts = _first_name(env, ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"))
    devices = env.get("CUDA_VISIBLE_DEVICES", "")
    return {
        "job_id": env.get("SLURM_JOB_ID") or None,
        "array_job_id": env.get("SLURM_ARRAY_JOB_ID") or None,
        "array_task_id": _int(env, "SLURM_ARRAY_TASK_ID") if env.get("SLURM_ARRAY_TASK_ID") else None,
        "restart_count": _int(env, restarts) if restarts else 0,
        "visible_devices": tuple(d.strip() for d in devices.split(",") if d.strip()),
    }


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
    missing = _missing(env, SLURM_REQUIRED)
    missing += [alts[1] for alts in SLURM_ALTERNATIVES.values() if not _first(env, alts)]
    if missing:
        raise EnvError(
            f"partially set SLURM environment: SLURM_PROCID is set but {', '.join(missing)} "
            "missing. HINT: start tasks with srun inside an allocation (not by copying variables)"
        )
    jobs = _job_fields(env)
    hosts = tuple(expand(_first(env, SLURM_ALTERNATIVES["nodelist"])))
    node_rank = _int(env, "SLURM_NODEID")
    per_node = parse_tasks_per_node(_first(env, SLURM_ALTERNATIVES["tasks_per_node"]))
    local_world = per_node[node_rank] if node_rank < len(per_node) else per_node[-1]
    port = _port_override(env) or master_port_for(
        jobs["job_id"], jobs["array_job_id"], jobs["array_task_id"])
    return DistEnv(
        source="slurm", rank=_int(env, "SLURM_PROCID"), local_rank=_int(env, "SLURM_LOCALID"),
        world_size=_int(env, "SLURM_NTASKS"), local_world_size=local_world, node_rank=node_rank,
        num_nodes=_int(env, _first_name(env, SLURM_ALTERNATIVES["num_nodes"])),
        master_addr=env.get("HPC_MASTER_ADDR") or hosts[0], master_port=port,
        hosts=hosts, **jobs,
    )


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    missing = _missing(env, TORCHRUN_REQUIRED)
    if missing:
        seen = [n for n in TORCHRUN_REQUIRED if n not in missing]
        raise EnvError(
            f"partially set torchrun environment: {', '.join(seen)} set but {', '.join(missing)} "
            "missing. HINT: launch with torchrun or `python -m hpc.launch`, or unset the others"
        )
    world = _int(env, "WORLD_SIZE")
    local_world = _int(env, "LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else world
    rank = _int(env, "RANK")
    node_rank = _int(env, "GROUP_RANK") if env.get("GROUP_RANK") else rank // local_world
    nodelist = _first(env, SLURM_ALTERNATIVES["nodelist"])
    return DistEnv(
        source="torchrun", rank=rank, local_rank=_int(env, "LOCAL_RANK"), world_size=world,
        local_world_size=local_world, node_rank=node_rank, num_nodes=max(1, world // local_world),
        master_addr=env["MASTER_ADDR"], master_port=_int(env, "MASTER_PORT"),
        hosts=tuple(expand(nodelist)) if nodelist else (), **_job_fields(env),
    )


def _single(env: Mapping[str, str]) -> DistEnv:
    ntasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or "1"
    if env.get("SLURM_JOB_ID") and ntasks != "1":
        # A batch script runs once, on the first node: it is not rank 0 of N.
        raise EnvError(
            f"inside SLURM job {env['SLURM_JOB_ID']} with {ntasks} tasks but not in a task "
            "(no SLURM_STEP_ID: not started by srun): this is the batch script, "
            "not one of the tasks. "
            "HINT: start the program with `srun python ...` so every task runs it"
        )
    return DistEnv(source="single", rank=0, local_rank=0, world_size=1, local_world_size=1,
                   node_rank=0, num_nodes=1, master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
                   master_port=_port_override(env) or SINGLE_PORT, **_job_fields(env))


def _in_step(env: Mapping[str, str]) -> bool:
    # The batch script of sbatch also carries SLURM_PROCID=0; only srun's tasks have a
    # SLURM_STEP_ID that is a number (the batch step has none, or reports 'batch').
    return bool(env.get("SLURM_PROCID")) and env.get("SLURM_STEP_ID", "").isdigit()


def from_environ(env: Mapping[str, str] | None = None) -> DistEnv:
    """Parse the environment (default os.environ) into a DistEnv. Pure for a given mapping."""
    env = os.environ if env is None else env
    slurm = _from_slurm(env) if _in_step(env) else None
    if any(env.get(n) for n in TORCHRUN_TRIGGERS):
        torchrun = _from_torchrun(env)
        same = slurm and (slurm.rank, slurm.world_size) == (torchrun.rank, torchrun.world_size)
        # Exported from SLURM's own values (hpc.launch, an earlier session): still a SLURM task.
        return slurm if same else torchrun
    if slurm:
        return slurm
    if env.get("SLURM_PROCID") and not env.get("SLURM_JOB_ID"):
        return _from_slurm(env)  # reports the partial SLURM set
    return _single(env)


def device_index(env: DistEnv) -> int | None:
    """CUDA ordinal this task should use, or None for CPU; from CUDA_VISIBLE_DEVICES alone.

    SLURM either gives each task its own GPU (one visible -> cuda:0) or each task sees
    all GPUs of the node (one per task -> cuda:local_rank). Anything else is a mistake.
    """
    gpus = len(env.visible_devices)
    if gpus == 0:
        return None
    if gpus == 1:
        return 0
    if env.world_size == 1:
        raise EnvError(
            f"world size 1 but {gpus} GPUs allocated ({','.join(env.visible_devices)}): only "
            "GPU 0 would do any work. HINT: run one task per GPU (srun --ntasks-per-node="
            f"{gpus}, or submitit tasks_per_node={gpus}) or request a single GPU"
        )
    if gpus != env.local_world_size:
        raise EnvError(
            f"{env.local_world_size} tasks on this node but {gpus} GPUs visible to each: "
            "tasks per node must equal GPUs per node. HINT: use --ntasks-per-node="
            f"{gpus}, or --gpus-per-task=1 so each task sees its own GPU"
        )
    return env.local_rank


def describe(env: DistEnv, probe_torch: bool = False) -> dict:
    """What `python -m hpc.env` prints: the parsed fields plus device and backend."""
    index = device_index(env)
    if probe_torch and index is not None:
        import torch  # only on request: the basic answer stays torch-free and fast

        index = index if torch.cuda.is_available() else None
    info = env.to_dict()
    info["visible_devices"] = list(env.visible_devices)
    info["hosts"] = list(env.hosts)
    info["device"] = "cpu" if index is None else f"cuda:{index}"
    info["backend"] = "gloo" if index is None else "nccl"
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc.env", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument("--torch", action="store_true",
                        help="import torch to check that the CUDA device really exists")
    args = parser.parse_args(argv)
    try:
        info = describe(from_environ(), probe_torch=args.torch)
    except EnvError as err:
        print(f"hpc.env: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        for key in ("source", "rank", "local_rank", "world_size", "local_world_size", "node_rank",
                    "num_nodes", "master_addr", "master_port", "device", "backend", "job_id",
                    "array_job_id", "array_task_id", "restart_count", "visible_devices", "hosts"):
            print(f"{key:17} {info[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
