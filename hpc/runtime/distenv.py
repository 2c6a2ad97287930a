"""The distributed environment's record, DistEnv, and the readers of the single variables it is built from.

Numbers are ASCII digits only; a nodelist is expanded as SLURM does; MASTER_PORT is derived from the
job id where no launcher gives one. Each refusal is an EnvError, one line with a HINT. Which
launcher's variables are read is hpc.runtime.envparse's to decide. No torch import here.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Mapping, MutableMapping

from hpc.slurm.hostlist import HostlistError, expand

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


def read_int(env: Mapping[str, str], name: str, least: int = 0) -> int:
    text = env[name]
    if not _INTEGER.fullmatch(text):
        raise EnvError(f"{name}={text!r} is not an integer (ASCII digits only). "
                       f"HINT: unset or fix {name}")
    value = int(text)
    if value < least:
        raise EnvError(f"{name}={value}, expected at least {least}. {LAUNCHER_HINT}")
    return value


def missing_names(env: Mapping[str, str], names) -> list[str]:
    return [n for n in names if not env.get(n)]


def first_name(env: Mapping[str, str], names) -> str | None:
    return next((n for n in names if env.get(n)), None)


def first_value(env: Mapping[str, str], names) -> str | None:
    name = first_name(env, names)
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


def read_port(env: Mapping[str, str], name: str) -> int | None:
    if not env.get(name):
        return None
    port = read_int(env, name)
    if not 1024 <= port <= 65535:
        raise EnvError(f"{name}={port} is outside 1024-65535. HINT: pick an unprivileged port")
    return port


def read_hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    """The nodelist, expanded as SLURM does; names no hostname can have are refused."""
    name = first_name(env, SLURM_ALTERNATIVES["nodelist"])
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


def job_fields(env: Mapping[str, str]) -> dict:
    """Job metadata, read whatever the launcher: ids, restarts, GPUs."""
    restarts = first_name(env, ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"))
    devices = env.get("CUDA_VISIBLE_DEVICES", "")
    ids = {key: str(read_int(env, name)) if env.get(name) else None
           for key, name in (("job_id", "SLURM_JOB_ID"), ("array_job_id", "SLURM_ARRAY_JOB_ID"))}
    return {
        **ids,
        "array_task_id": (read_int(env, "SLURM_ARRAY_TASK_ID") if env.get("SLURM_ARRAY_TASK_ID")
                          else None),
        "restart_count": read_int(env, restarts) if restarts else 0,
        "visible_devices": tuple(d.strip() for d in devices.split(",") if d.strip()),
    }
