"""A real SLURM cluster on one machine, for tests and for rehearsing pipelines before spending an allocation.

    python -m hpc.cluster up --dir /tmp/hpc-cluster
    eval "$(python -m hpc.cluster env --dir /tmp/hpc-cluster)"
    python -m hpc.cluster down --dir /tmp/hpc-cluster
"""

from hpc.cluster.daemons import ClusterError
from hpc.cluster.local import LocalCluster

__all__ = ["ClusterError", "LocalCluster"]
