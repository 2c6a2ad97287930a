"""SLURM's client programs and their answers: the only place hpc runs sbatch's siblings.

Usage::

    from hpc.slurm import scheduler
    answer = scheduler.query(["12_3", "13"])     # one sacct call (squeue where accounting is disabled)
    scheduler.detect("auto")                     # "slurm" when a controller answers, else "local"

Parts::

    cli.py         running scontrol, sacct, squeue, scancel with a timeout; does a controller answer
    retry.py       which of SLURM's failures are transient (retried with backoff under a deadline) or final
    jobcontrol.py  one job: show, requeue, release, update, cancel (one client call each)
    scheduler.py   job states from one call per poll (sacct, else squeue; empty answers checked), partitions
    jobstates.py   the state table and the one parser of sacct's and squeue's answers (pure)
    tokens.py      the jobs slurmctld holds by the token in their comment (one squeue --me call)
    steps.py       a --cluster here step's name, and the running steps of allocations (one squeue --steps call)
    limits.py      the site's submit limits (sacctmgr), read once and kept; a run that cannot fit is refused
    siteconfig.py  MaxArraySize from `scontrol show config`, kept in the user's cache per slurm.conf
    hostlist.py    hostlist expressions as `scontrol show hostnames` expands them
    noderange.py   node counts and MIN-MAX node ranges of a stage
    submitenv.py   what a new job must not inherit from the allocation it is submitted from

Costs: one scheduler call per status poll whatever the number of jobs (hpc.monitor.status).
Imports no torch.
"""
