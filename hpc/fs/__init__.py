"""Files that survive a kill at any moment, on a local disk or a shared filesystem. Imports no torch.

    python -m hpc.fs runs/ /scratch/ckpt     # filesystem type, mount options, what hpc does there

Usage::

    from hpc.fs import atomic
    atomic.write_text(run / "manifest.json", text)    # temporary name, fsync, rename, directory fsync

Parts::

    atomic.py     the one atomic write (write_bytes, write_text, replacing) and batched directory syncs
    sharedfs.py   NFS, Lustre, GPFS, BeeGFS, CIFS: mmap or read, listing instead of stat, lock support
    filestamp.py  a file's stat standing in for its content, and when it cannot (racy files)
    usercache.py  the user's cache directory ($HPC_CACHE_DIR): configs, snapshots, carried copies, SLURM limits
    __main__.py   python -m hpc.fs PATH

The bottom layer: the run directory, checkpoints and hang records all write through it.
"""
