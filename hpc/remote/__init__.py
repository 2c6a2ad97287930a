"""Named clusters: submit, watch and cancel runs on a cluster's login node over ssh, from a machine without SLURM.

    python -m hpc.submit tests.tiny_pipeline --cluster jean-zay     # clusters named in ~/.config/hpc/clusters.yaml
    python -m hpc.status jean-zay:RUN_DIR;  hpc.Run.attach("jean-zay:RUN_DIR").wait()

Parts::

    clusters.py    the user's file of named clusters, parsed into Cluster entries; unknown names refused
    ssh.py         one ssh connection per command (ControlMaster), failures as one line with the command to try
    push.py        the code tree by digest, and the push of the files the cluster lacks
    store.py       the cluster's side of a push: a content-addressed store, trees made whole or not at all
    submission.py  a Request sent to a named cluster: one ssh call when the cluster holds the code
    land.py        the cluster's side of it: hpc's version, the tree, then python -m hpc.submit there
    watch.py       NAME:RUN_DIR for hpc.status, hpc.logs, hpc.cancel and hpc.Run.attach; recent runs
    recent.py      the cluster's side of that listing

The run directory and everything a job needs live on the cluster (docs/remote.md).
"""
