"""A file's stat as a stand-in for its content: git's shortcut for a clean file, and its guard for racy ones.

    python -c "from hpc.fs.filestamp import stamp; print(stamp('pyproject.toml'))"

A file that still has the size, mtime, ctime and inode seen before holds the content it held then:
every write moves its ctime (which no call can set back) and a replacement changes its inode. Unless
the write came within one timestamp tick of that look: a file modified within RACY_NS of it is racy,
and only its content vouches for it. Used where reading every file would cost more than it saves:
the snapshot's listing (hpc.rundir.codefiles), the config cache's key (hpc.config.cache) and the
kept MaxArraySize (hpc.slurm.siteconfig).
"""
from __future__ import annotations

import os
import time
from typing import Optional, Tuple

# One tick (1 s on Lustre and many NFS servers), and a second more for the file server's clock against
# this host's.
RACY_NS = 2_000_000_000


def stamp(path: str, now_ns: Optional[int] = None) -> Optional[Tuple[int, int, int, int]]:
    """(size, mtime_ns, ctime_ns, inode) of `path`; None when it was modified within RACY_NS of
    `now_ns` (default: now), when its stat does not vouch for its content. OSError when it is gone."""
    st = os.stat(path)
    now = time.time_ns() if now_ns is None else now_ns
    if now - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
