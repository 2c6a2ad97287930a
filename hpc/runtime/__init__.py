"""What runs inside a task: its environment, its process group, its data, its random state.

Usage::

    env = from_environ()                         # hpc.runtime.envparse: SLURM, torchrun or one process
    with hpc.ddp.session() as s:                 # hpc.ddp (the API) builds a Session (session.py)
        model = s.wrap(model, strategy="ddp")    # or "fsdp" (fsdp.py)

Parts::

    distenv.py      DistEnv, the frozen record of rank, world, rendezvous; readers of single variables
    envparse.py     from_environ: the environment parsed once, impossible ones refused with a HINT
    devicebind.py   which device a task binds, and what python -m hpc.env reports
    session.py      Session: wrap, all-reduce helpers, data loaders, autocast, on one process group
    fsdp.py         FSDP2 sharding, and models built on the meta device
    teardown.py     every rank reaches the exit before any tears the group down
    sampler.py      a distributed sampler whose position is checkpointed state
    batching.py     the same global batch on any number of devices (accumulation, LR scaling)
    sharding.py     round-robin sharding of an index list, reshuffled each epoch
    rng.py          capture and restore every generator a step may touch
    scalars.py      scalars logged without waiting for the device
    resumepoint.py  which checkpoint a TrainLoop resumes from
    loopstate.py    what a TrainLoop checkpoint holds of its objects and RNGs, and how a resume restores it
    loopshards.py   a TrainLoop's model and optimizer saved and loaded through DCP
    ports.py        a free TCP port for a rendezvous

envparse, distenv and devicebind import no torch (python -m hpc.env answers in milliseconds).
"""
