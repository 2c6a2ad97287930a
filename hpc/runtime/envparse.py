"""The distributed environment of this process, parsed once into a frozen, coherent DistEnv.

    python -c "from hpc.runtime.envparse import from_environ; print(from_environ())"

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

import os
import re
from typing import Mapping

from hpc.runtime.distenv import (
    LAUNCHER_HINT,
    SINGLE_PORT,
    SLURM_ALTERNATIVES,
    SLURM_REQUIRED,
    TORCHRUN_REQUIRED,
    TORCHRUN_TRIGGERS,
    DistEnv,
    EnvError,
    first_name,
    first_value,
    job_fields,
    master_port_for,
    missing_names,
    parse_tasks_per_node,
    read_hosts,
    read_int,
    read_port,
)


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
    missing = missing_names(env, SLURM_REQUIRED)
    missing += [alts[1] for alts in SLURM_ALTERNATIVES.values() if not first_value(env, alts)]
    if missing:
        raise EnvError(
            f"partially set SLURM environment: SLURM_PROCID is set but {', '.join(missing)} "
            "missing. HINT: start tasks with srun inside an allocation (not by copying variables)"
        )
    jobs = job_fields(env)
    hosts = read_hosts(env)
    nodes_name = first_name(env, SLURM_ALTERNATIVES["num_nodes"])
    per_node_name = first_name(env, SLURM_ALTERNATIVES["tasks_per_node"])
    world, nodes = read_int(env, "SLURM_NTASKS", 1), read_int(env, nodes_name, 1)
    node_rank = read_int(env, "SLURM_NODEID")
    per_node = parse_tasks_per_node(env[per_node_name])
    nodelist = first_name(env, SLURM_ALTERNATIVES["nodelist"])
    for ok, seen in ((len(hosts) == nodes, f"{nodelist} has {len(hosts)} hosts"),
                     (len(per_node) == nodes, f"{per_node_name} counts {len(per_node)} nodes"),
                     (sum(per_node) == world, f"{per_node_name} sums to {sum(per_node)} tasks "
                                              f"but SLURM_NTASKS={world}")):
        if not ok:
            raise EnvError(f"impossible environment: {seen}, {nodes_name}={nodes}. {LAUNCHER_HINT}")
    if node_rank >= nodes:
        raise EnvError(f"impossible environment: SLURM_NODEID={node_rank} but {nodelist} has "
                       f"{len(hosts)} hosts. {LAUNCHER_HINT}")
    port = read_port(env, "HPC_MASTER_PORT") or master_port_for(jobs["job_id"])
    names = {"rank": "SLURM_PROCID", "local_rank": "SLURM_LOCALID", "world": "SLURM_NTASKS",
             "local_world": per_node_name, "node": "SLURM_NODEID", "nodes": nodes_name}
    return _check(DistEnv(
        source="slurm", rank=read_int(env, "SLURM_PROCID"), local_rank=read_int(env, "SLURM_LOCALID"),
        world_size=world, local_world_size=per_node[node_rank], node_rank=node_rank,
        num_nodes=nodes, master_addr=env.get("HPC_MASTER_ADDR") or hosts[0], master_port=port,
        hosts=hosts, **jobs,
    ), names)


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    missing = missing_names(env, TORCHRUN_REQUIRED)
    if missing:
        seen = [n for n in TORCHRUN_REQUIRED if n not in missing]
        raise EnvError(
            f"partially set torchrun environment: {', '.join(seen)} set but {', '.join(missing)} "
            "missing. HINT: launch with torchrun or `python -m hpc.launch`, or unset the others"
        )
    world = read_int(env, "WORLD_SIZE", 1)
    local_world = read_int(env, "LOCAL_WORLD_SIZE", 1) if env.get("LOCAL_WORLD_SIZE") else world
    rank = read_int(env, "RANK")
    node_rank = read_int(env, "GROUP_RANK") if env.get("GROUP_RANK") else rank // local_world
    nodes = (read_int(env, "GROUP_WORLD_SIZE", 1) if env.get("GROUP_WORLD_SIZE")
             else -(-world // local_world))
    names = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world": "WORLD_SIZE",
             "local_world": "LOCAL_WORLD_SIZE", "node": "GROUP_RANK", "nodes": "GROUP_WORLD_SIZE"}
    return _check(DistEnv(
        source="torchrun", rank=rank, local_rank=read_int(env, "LOCAL_RANK"), world_size=world,
        local_world_size=local_world, node_rank=node_rank, num_nodes=nodes,
        master_addr=env["MASTER_ADDR"], master_port=read_port(env, "MASTER_PORT"),
        hosts=read_hosts(env), **job_fields(env),
    ), names)


def _single(env: Mapping[str, str]) -> DistEnv:
    jobs = job_fields(env)
    ntasks_name = first_name(env, ("SLURM_NTASKS", "SLURM_NPROCS"))
    ntasks = read_int(env, ntasks_name, 1) if ntasks_name else 1
    if jobs["job_id"] and ntasks != 1:
        # A batch script runs once, on the first node: it is not rank 0 of N.
        raise EnvError(
            f"inside SLURM job {jobs['job_id']} with {ntasks} tasks but not in a task "
            "(no SLURM_STEP_ID: not started by srun): this is the batch script, "
            "not one of the tasks. "
            "HINT: start the program with `srun python ...` so every task runs it"
        )
    port = read_port(env, "HPC_MASTER_PORT") or read_port(env, "MASTER_PORT") or SINGLE_PORT
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
