"""The environment a new job is submitted with: nothing of the allocation or launcher it is submitted from.

    with submission_env(): executor.submit(task)     # SLURM_*, SBATCH_*, RANK, ... hidden meanwhile
    with own_setting("HPC_SLURM_RETRY_S", "5"): ...  # this process's calls only, not the jobs it submits

sbatch exports the submitting process's environment into the job, so a submission from inside an
allocation (an salloc shell, a job that submits the next stage) or from under a launcher would hand
the new job the old one's variables. Only how the clients find the controller is kept. A setting a
process makes for its own SLURM calls (own_setting: hpc.afterstep's short retry deadline at a stop)
is not the new job's either: the job gets the value from before it, or none.
"""
from __future__ import annotations

import contextlib
import os
from typing import Dict, Iterator, MutableMapping, Optional

# Submitting from inside an allocation (an salloc shell, a job that submits the next stage) or a
# launcher: sbatch exports the submitting environment into the new job, sbatch reads SBATCH_* as its
# own options (SBATCH_PARTITION), srun in the new job reads SLURM_NTASKS & co. as its options, and a
# leaked RANK/WORLD_SIZE would describe the wrong world. None of them belongs to the new job.
INHERITED_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SBATCH_", "SALLOC_", "SUBMITIT_", "TORCHELASTIC_")
INHERITED_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE"})
# ... except how the SLURM clients find the controller (a sandbox's or a configless site's).
CLIENT_CONFIG = frozenset({"SLURM_CONF", "SLURM_CONF_SERVER"})


def inherited(name: str) -> bool:
    """Whether `name` comes from an enclosing allocation or launcher and must not reach a new job."""
    return name not in CLIENT_CONFIG and (name.startswith(INHERITED_PREFIXES) or name in INHERITED_NAMES)


# The settings made with own_setting that are in force, each with its value from before (None: unset).
OWN: Dict[str, Optional[str]] = {}


@contextlib.contextmanager
def own_setting(name: str, value: str, environ: MutableMapping[str, str] = os.environ) -> Iterator[None]:
    """`name`=`value` in `environ` meanwhile, for this process's own clients; a job submitted meanwhile
    (submission_env) gets the value from before. The value from before is back afterwards."""
    OWN[name] = environ.get(name)
    environ[name] = value
    try:
        yield
    finally:
        _put(environ, name, OWN.pop(name))


def _put(environ: MutableMapping[str, str], name: str, value: Optional[str]) -> None:
    if value is None:
        environ.pop(name, None)
    else:
        environ[name] = value


@contextlib.contextmanager
def submission_env(environ: MutableMapping[str, str] = os.environ) -> Iterator[Dict[str, str]]:
    """Hide the inherited variables while jobs are submitted (and, for the local executors, run), and
    give the own settings (own_setting) their values from before; all are put back afterwards, so the
    submitting process itself is unchanged."""
    hidden = {name: environ.pop(name) for name in [n for n in environ if inherited(n)]}
    own = {name: environ.get(name) for name in OWN}
    for name, before in OWN.items():
        _put(environ, name, before)
    try:
        yield hidden
    finally:
        environ.update(hidden)
        for name, value in own.items():
            _put(environ, name, value)
