"""`--cluster here`: a run's stages as srun steps of the allocation this shell is in (salloc).

    salloc -N 2 --ntasks-per-node=2 --gres=gpu:2
    python -m hpc.submit langsplat --profile sandbox --levels 1 --cluster here --run-dir runs/dev

The plan, run directory, snapshot and manifest are the batch submission's; hpc.api hands the engine
this package's Backend for the `here` kind, and the one launch path (hpc.pipeline.launcher) runs each
job's tasks through it, as steps of the allocation instead of sbatch jobs.

Parts::

    backend.py  Here: the launch path's backend (one job's tasks, side by side as far as the allocation holds)
    steps.py    one task's step: its srun command, its start, the ranks' questions answered, its end told
    alloc.py    the allocation it runs in, and each step's exact share of it (not the allocation's shape)
    rank.py     what each rank of a step runs (python -m hpc.here.rank): the StageTask, and its result file
    stops.py    Ctrl-C there: this run's steps stopped at a checkpoint, then ended; what stopped a step

Imports no torch; sits above hpc.pipeline, beside hpc.sweep.
"""
