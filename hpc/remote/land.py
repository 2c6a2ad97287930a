"""The cluster's side of a submission: check hpc's version, find the pushed tree, run hpc.submit in it.

    python -m hpc.remote.land VERSION RUNS TREE SUBDIR RUN_DIR -- PIPELINE [hpc.submit's arguments]

One ssh call when the cluster holds the code already: hpc.remote.submission runs this by the
cluster's interpreter, which imports only hpc's root and the store here (a few ms) before it
replaces itself with `python -m hpc.submit ARGS --run-dir RUN_DIR`, in RUNS/.hpc-code/trees/TREE/SUBDIR.
RUNS and a relative RUN_DIR are resolved from the login's home directory; the first line out is
'@run-dir PATH', so that the laptop names the run before anything is submitted. Exit statuses the
laptop reads: PUSH (the tree is not there: the runs root is the line out; push, then call again)
and OTHER_HPC (another version of hpc here: its version is the line out).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

import hpc
from hpc.remote import store

PUSH = 75
OTHER_HPC = 76


def main(argv: Sequence[str]) -> int:
    if len(argv) < 6 or argv[5] != "--":
        print("usage: python -m hpc.remote.land VERSION RUNS TREE SUBDIR RUN_DIR -- ARGS", file=sys.stderr)
        return 2
    version, runs, tree, subdir, run_dir, args = argv[0], argv[1], argv[2], argv[3], argv[4], argv[6:]
    if version != hpc.__version__:
        print(hpc.__version__)
        return OTHER_HPC
    runs = os.path.abspath(os.path.expanduser(runs))
    code = store.existing_tree(Path(runs, ".hpc-code"), tree)
    if code is None:
        print(runs)
        return PUSH
    run_dir = os.path.join(runs, run_dir)
    print(f"@run-dir {run_dir}", flush=True)
    os.chdir(os.path.normpath(os.path.join(code, subdir)))
    flags = sys.orig_argv[1:sys.orig_argv.index("-m")] if "-m" in sys.orig_argv else []  # -S, -X ... kept
    os.execv(sys.executable, [sys.executable, *flags, "-m", "hpc.submit", *args, "--run-dir", run_dir])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
