"""A run directory and what it records on disk: the one place a run's state lives.

Layout::

    <run>/config.yaml                the resolved config
    <run>/manifest.json              job ids of every attempt per stage and task, code version, run id
    <root>/.hpc-snapshots/<hash>/, <hash>.json  the code snapshots the runs of a root import, and their listings
    <run>/<stage>/[task-<item>/]     a task's outputs, checkpoints/, logs, its `done` marker
    <sweep>/sweep.json, <sweep>/<signature>/   a sweep: its grid, one run directory per point

Parts::

    run.py        RunDir: manifest, config, task folders, done markers, the submission lock
    kind.py       whether a path is a run, a sweep or either, refused with what it is (hpc.Run, hpc.cancel)
    codeversion.py  which code a submission ran: the git commit of the user's checkout, hpc's version
    intents.py    each sbatch's token and tasks, written down before it runs, until the manifest has its ids
    logdirs.py    where a job's submitit files are: a folder per job, one per array for its tasks
    sweepdir.py   SweepDir: the grid a sweep records, its points, a point's name in words
    snapshot.py   the code snapshot: taken at submission, entered by each job (JobCode)
    codefiles.py  which files of a tree are code, and whether they are as a listing says
    codedrift.py  how the live tree differs from a snapshot: hpc.status's line about the code
    snapcache.py  the snapshot store of a run root, and the newest snapshot of each tree
    treecopy.py   a directory made whole or not at all, and files copied into it (the snapshot's, carry's)
    tracking.py   run ids for experiment trackers, the same in every attempt
    attempts.py   each attempt of a task as rank 0 saw it: software, first step, checkpoints, end
    software.py   what an attempt runs on: torch, CUDA, NCCL, driver, GPU, Python, hpc, packages, image
    imagestamp.py the container image stamped by its content, 1 MiB read whatever its size
    notify.py     the messages a run's jobs send about it (webhook, command), once per event per run

Imports no torch: submission and status read it.
"""
