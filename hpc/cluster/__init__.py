"""A real SLURM cluster on one machine, for tests and for rehearsing pipelines before spending an allocation.

    python -m hpc.cluster up --dir /tmp/hpc-cluster
    eval "$(python -m hpc.cluster env --dir /tmp/hpc-cluster)"
    python -m hpc.cluster down --dir /tmp/hpc-cluster

Real daemons, each a foreground process this package owns: munge, MariaDB with slurmdbd (so sacct
works), slurmctld, and one slurmd per node with fake GPUs (character devices declared as gres/gpu).
Partition `low` (the default) is preempted with requeue by `high`. Every file lives under the
cluster's directory; each cluster takes a block of ports of its own, so clusters side by side (one
per test worker) never meet. Site variants: configless, and without accounting.

Parts::

    local.py         LocalCluster: up (idempotent, returns once every node is idle), settle, down
    layout.py        paths, ports, node names and job ids, computed without side effects
    files.py         slurm.conf, gres.conf, slurmdbd.conf as text; the cluster's files written
    nodestate.py     the nodes as sinfo sees them: waiting until they answer, settling them idle
    daemonset.py     which daemons run, and each one's command line
    daemons.py       starting and stopping one daemon; node names that resolve
    accountingdb.py  MariaDB's data directory and the database slurmdbd uses
    portclaims.py    a free block of ports, claimed host-wide while an `up` starts
    preempt.py       a real preemption of a job, to rehearse its resume
    install.py       the Debian packages it needs
    __main__.py      python -m hpc.cluster up|env|status|preempt|down|install
"""

from hpc.cluster.daemons import ClusterError
from hpc.cluster.local import LocalCluster

__all__ = ["ClusterError", "LocalCluster"]
