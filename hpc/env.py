"""The distributed environment of this process, parsed once into a frozen, coherent DistEnv.

    python -m hpc.env [--json] [--torch]

Three sources: a SLURM task started by srun (SLURM_PROCID, ...), a torchrun-style launcher
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or a single process. Inside an srun
step SLURM's variables win unless torchrun started the process (TORCHELASTIC_RUN_ID): sbatch
exports the submitting shell's environment, and a RANK=0 WORLD_SIZE=1 left there must not make
every task rank 0 of 1. Numbers are ASCII digits only, and an environment that no launcher
produces (rank 7 of 2, a node beyond the nodelist) is an EnvError, one line with a HINT.
`from_environ` is pure (give it a dict); `DistEnv.export` is the only writer of os.environ.
No torch import here: `python -m hpc.env` answers in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import Mapping, MutableMapping

from hpc.hostlist import HostlistError, expand

__all__ = ["DistEnv", "EnvError", "from_environ", "master_port_for", "bind_device",
           "device_index", "main"]

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
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
}
_INTEGER = re.compile(r"-?[0-9]{1,18}")  # not int(): it takes '4_0', ' 4' and non-ASCII digits
LAUNCHER_HINT = ("HINT: these variables come from the launcher (srun or torchrun); unset any "
                 "set by hand or inherited from another job")


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


def _int(env: Mapping[str, str], name: str, least: int = 0) -> int:
    text = env[name]
    if not _INTEGER.fullmatch(text):
        raise EnvError(f"{name}={text!r} is not an integer (ASCII digits only). "
                       f"HINT: unset or fix {name}")
    value = int(text)
    if value < least:
        raise EnvError(f"{name}={value}, expected at least {least}. {LAUNCHER_HINT}")
    return value


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
        m = re.fullmatch(r"([0-9]{1,6})(?:\(x([0-9]{1,6})\))?", part)
        if not m or int(m.group(1)) < 1 or int(m.group(2) or 1) < 1:
            raise EnvError(f"tasks-per-node value {text!r} not understood; expected positive "
                           f"counts such as '2(x3),1'. {LAUNCHER_HINT}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def master_port_for(job_id: str | None) -> int:
    """Same on every node of a job, different for concurrent jobs: SLURM_JOB_ID is unique,
    also per array task. Jobs PORT_SPAN ids apart share a port (not concurrent in practice)."""
    if job_id is None:
        return SINGLE_PORT
    return PORT_BASE + int(job_id) % PORT_SPAN


def _port(env: Mapping[str, str], name: str) -> int | None:
    if not env.get(name):
        return None
    port = _int(env, name)
    if not 1024 <= port <= 65535:
        raise EnvError(f"{name}={port} is outside 1024-65535. HINT: pick an unprivileged port")
    return port


def _hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    """The nodelist, expanded as SLURM does; names no hostname can have are refused."""
    name = _first_name(env, SLURM_ALTERNATIVES["nodelist"])
    if name is None:
        return ()
    try:
        hosts = tuple(expand(env[name]))
    except HostlistError as err:
        raise EnvError(f"{name}: {err}") from None
    odd = next((h for h in hosts if not h.isprintable() or not h or set(h) & set("[] ,")), None)
    if not hosts or odd is not None:
        what = "names no host" if not hosts else f"gives the host name {odd!r}"
        raise EnvError(f"{name}={env[name]!r} {what}; expected a SLURM nodelist such as "
                       f"'gpu[01-04]'. {LAUNCHER_HINT}")
    return hosts


def _job_fields(env: Mapping[str, str]) -> dict:
    """Job metadata, read whatever the launcher: ids, restarts, GPUs."""
    restarts = _first_name(env, ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"))
    devices = env.get("CUDA_VISIBLE_DEVICES", "")
    ids = {key: str(_int(env, name)) if env.get(name) else None
           for key, name in (("job_id", "SLURM_JOB_ID"), ("array_job_id", "SLURM_ARRAY_JOB_ID"))}
    return {
        **ids,
        "array_task_id": (_int(env, "SLURM_ARRAY_TASK_ID") if env.get("SLURM_ARRAY_TASK_ID")
                          else None),
        "restart_count": _int(env, restarts) if restarts else 0,
        "visible_devices": tuple(d.strip() for d in devices.split(",") if d.strip()),
    }


def _check(d: DistEnv, names: dict[str, str]) -> DistEnv:
    """Refuse what no launcher produces: each (condition, what was seen, what is expected)."""
    n = names
    rules = [
        (d.rank < d.world_size, f"{n['rank']}={d.rank} with {n['world']}={d.world_size}",
         f"a rank from 0 to {d.world_size - 1}"),
        (d.local_world_size <= d.world_size,
         f"{n['local_world']}={d.local_world_size} with {n['world']}={d.world_size}",
         "no more tasks on a node than in the job"),
        (d.local_rank < d.local_world_size,
         f"{n['local_rank']}={d.local_rank} with {d.local_world_size} tasks on this node "
         f"({n['local_world']})", f"a local rank from 0 to {d.local_world_size - 1}"),
        (d.num_nodes <= d.world_size, f"{n['nodes']}={d.num_nodes} with {n['world']}="
         f"{d.world_size}", "at least one task per node"),
        (d.node_rank < d.num_nodes, f"{n['node']}={d.node_rank} with {d.num_nodes} nodes "
         f"({n['nodes']})", f"a node rank from 0 to {d.num_nodes - 1}"),
    ]
    for ok, seen, expected in rules:
        if not ok:
            raise EnvError(f"impossible environment: {seen}; expected {expected}. {LAUNCHER_HINT}")
    return d


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
    missing = _missing(env, SLURM_REQUIRED)
    missing += [alts[1] for alts in SLURM_ALTERNATIVES.values() if not _first(env, alts)]
    if missing:
        raise EnvError(
            f"partially set SLURM environment: SLURM_PROCID is set but {', '.join(missing)} "
            "missing. HINT: start tasks with srun inside an allocation (not by copying variables)"
        )
    jobs = _job_fields(env)
    hosts = _hosts(env)
    nodes_name = _first_name(env, SLURM_ALTERNATIVES["num_nodes"])
    per_node_name = _first_name(env, SLURM_ALTERNATIVES["tasks_per_node"])
    world, nodes = _int(env, "SLURM_NTASKS", 1), _int(env, nodes_name, 1)
    node_rank = _int(env, "SLURM_NODEID")
    per_node = parse_tasks_per_node(env[per_node_name])
    nodelist = _first_name(env, SLURM_ALTERNATIVES["nodelist"])
    for ok, seen in ((len(hosts) == nodes, f"{nodelist} has {len(hosts)} hosts"),
                     (len(per_node) == nodes, f"{per_node_name} counts {len(per_node)} nodes"),
                     (sum(per_node) == world, f"{per_node_name} sums to {sum(per_node)} tasks "
                                              f"but SLURM_NTASKS={world}")):
        if not ok:
            raise EnvError(f"impossible environment: {seen}, {nodes_name}={nodes}. {LAUNCHER_HINT}")
    if node_rank >= nodes:
        raise EnvError(f"impossible environment: SLURM_NODEID={node_rank} but {nodelist} has "
                       f"{len(hosts)} hosts. {LAUNCHER_HINT}")
    port = _port(env, "HPC_MASTER_PORT") or master_port_for(jobs["job_id"])
    names = {"rank": "SLURM_PROCID", "local_rank": "SLURM_LOCALID", "world": "SLURM_NTASKS",
             "local_world": per_node_name, "node": "SLURM_NODEID", "nodes": nodes_name}
    return _check(DistEnv(
        source="slurm", rank=_int(env, "SLURM_PROCID"), local_rank=_int(env, "SLURM_LOCALID"),
        world_size=world, local_world_size=per_node[node_rank], node_rank=node_rank,
        num_nodes=nodes, master_addr=env.get("HPC_MASTER_ADDR") or hosts[0], master_port=port,
        hosts=hosts, **jobs,
    ), names)


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    missing = _missing(env, TORCHRUN_REQUIRED)
    if missing:
        seen = [n for n in TORCHRUN_REQUIRED if n not in missing]
        raise EnvError(
            f"partially set torchrun environment: {', '.join(seen)} set but {', '.join(missing)} "
            "missing. HINT: launch with torchrun or `python -m hpc.launch`, or unset the others"
        )
    world = _int(env, "WORLD_SIZE", 1)
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1) if env.get("LOCAL_WORLD_SIZE") else world
    rank = _int(env, "RANK")
    node_rank = _int(env, "GROUP_RANK") if env.get("GROUP_RANK") else rank // local_world
    nodes = (_int(env, "GROUP_WORLD_SIZE", 1) if env.get("GROUP_WORLD_SIZE")
             else -(-world // local_world))
    names = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world": "WORLD_SIZE",
             "local_world": "LOCAL_WORLD_SIZE", "node": "GROUP_RANK", "nodes": "GROUP_WORLD_SIZE"}
    return _check(DistEnv(
        source="torchrun", rank=rank, local_rank=_int(env, "LOCAL_RANK"), world_size=world,
        local_world_size=local_world, node_rank=node_rank, num_nodes=nodes,
        master_addr=env["MASTER_ADDR"], master_port=_port(env, "MASTER_PORT"),
        hosts=_hosts(env), **_job_fields(env),
    ), names)


def _single(env: Mapping[str, str]) -> DistEnv:
    jobs = _job_fields(env)
    ntasks_name = _first_name(env, ("SLURM_NTASKS", "SLURM_NPROCS"))
    ntasks = _int(env, ntasks_name, 1) if ntasks_name else 1
    if jobs["job_id"] and ntasks != 1:
        # A batch script runs once, on the first node: it is not rank 0 of N.
        raise EnvError(
            f"inside SLURM job {jobs['job_id']} with {ntasks} tasks but not in a task "
            "(no SLURM_STEP_ID: not started by srun): this is the batch script, "
            "not one of the tasks. "
            "HINT: start the program with `srun python ...` so every task runs it"
        )
    port = _port(env, "HPC_MASTER_PORT") or _port(env, "MASTER_PORT") or SINGLE_PORT
    return DistEnv(source="single", rank=0, local_rank=0, world_size=1, local_world_size=1,
                   node_rank=0, num_nodes=1, master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
                   master_port=port, **jobs)


def _in_step(env: Mapping[str, str]) -> bool:
    # The batch script of sbatch also carries SLURM_PROCID=0; only srun's tasks have a
    # SLURM_STEP_ID that is a number (the batch step has none, or reports 'batch').
    step = env.get("SLURM_STEP_ID", "")
    return bool(env.get("SLURM_PROCID")) and bool(re.fullmatch("[0-9]+", step))


def from_environ(env: Mapping[str, str] | None = None) -> DistEnv:
    """Parse the environment (default os.environ) into a DistEnv. Pure for a given mapping."""
    env = os.environ if env is None else env
    if _in_step(env) and not env.get("TORCHELASTIC_RUN_ID"):
        return _from_slurm(env)  # any RANK/WORLD_SIZE here was inherited, or exported from SLURM's
    if any(env.get(n) for n in TORCHRUN_TRIGGERS):
        return _from_torchrun(env)
    if env.get("SLURM_PROCID") and not env.get("SLURM_JOB_ID"):
        return _from_slurm(env)  # reports the partial SLURM set
    return _single(env)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc.env", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument("--torch", action="store_true",
                        help="import torch to count the CUDA devices this process really sees")
    args = parser.parse_args(argv)
    try:
        info = describe(from_environ(), probe_torch=args.torch)
    except EnvError as err:
        print(f"hpc.env: {err}", file=sys.stderr)
        return 2
    if info["warning"]:
        print(f"hpc.env: warning: {info['warning']}", file=sys.stderr)
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
