"""The container stand-in of the SLURM tests: a bubblewrap box in which a job's ranks see no SLURM
client and none of the host's hpc or its pure-Python requirements, as in a Pyxis image with torch
alone. The ranks import hpc from the copy hpc carries in (hpc.container.carry, container.hpc=carry).

    python -m hpc.submit box --cluster slurm cluster.container.runtime=exec "cluster.container.prefix=$(...)"

Used by tests/slurm/test_container_exec.py, test_node_failure.py and test_langsplat.py.
"""
import glob
import json
import os
import shutil
import site
import sys

from hpc.container import carry

CLIENTS = ("scontrol", "sbatch", "srun", "scancel", "squeue", "sacct", "salloc", "sinfo", "sacctmgr", "sstat")


def box_prefix() -> list:
    """bwrap over the whole file system, with every SLURM client masked by /dev/null (neither on PATH
    nor runnable where it is installed), every folder the host imports a carried module from hidden
    under an empty tmpfs, and the editable install's hook emptied: the tasks can reach neither SLURM
    nor hpc but through the carried copy. SLURM signals every process of a step, bwrap included,
    which (unlike Apptainer's starter) neither handles nor forwards them: it starts with SIGTERM and
    SIGUSR2 ignored, so that the rank inside, which installs its own handlers, is the one that acts on them."""
    clients = sorted({shutil.which(name) for name in CLIENTS} - {None})
    files = [*clients, *_editable_hooks()]
    dirs = []
    for path in carry.sources().values():
        (dirs if os.path.isdir(path) else files).append(path)
    masks = [w for path in files for w in ("--ro-bind", "/dev/null", path)]
    masks += [w for path in sorted(set(dirs)) for w in ("--tmpfs", path)]
    return ["sh", "-c", "trap '' TERM USR2; exec \"$@\"", "sh",
            "bwrap", "--die-with-parent", "--bind", "/", "/", "--dev-bind", "/dev", "/dev", *masks]


def _editable_hooks() -> list:
    """The .pth file and import finder of an editable install of hpc (pip install -e), in any site folder."""
    folders = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    found = {p for f in folders if os.path.isdir(f) for p in glob.glob(os.path.join(f, "__editable__*hpc*"))}
    return sorted(found)


def boxed(python: str = sys.executable, hpc: str = "carry") -> list:
    """The overrides that run every stage of a submission in the box."""
    return ["cluster.container.runtime=exec", f"cluster.container.prefix={json.dumps(box_prefix())}",
            f"cluster.container.python={python}", f"cluster.container.hpc={hpc}"]
