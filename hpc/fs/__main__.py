"""What hpc finds at a path, and what it does there.

    python -m hpc.fs runs/ /scratch/ckpt      # filesystem type, mount options, mmap, lock warnings
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from hpc.fs.sharedfs import MOUNTS, local_locks, mmap_ok, mount_of, network


def main(argv: Optional[Sequence[str]] = None) -> int:
    for path in (argv if argv is not None else sys.argv[1:]) or ["."]:
        m = mount_of(path)
        if m is None:
            print(f"{path}: {MOUNTS} unreadable; treated as a local disk")
            continue
        print(f"{path}: {m.fstype} at {m.point} ({','.join(m.options)}); network: {network(path)}, "
              f"checkpoints memory-mapped: {mmap_ok(path)}")
        warning = local_locks(path)
        if warning:
            print(f"  {warning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
