"""GPUs per node of a partition, as sinfo says: what packing is planned against (hpc.pipeline.packing).

    python -c "from hpc.slurm import gres; print(gres.node_gpus('gpu'))"

One `sinfo -h -o '%P %G'` call lists every partition with the generic resources of its nodes
("gpu* gpu:8", "big gpu:a100:8(S:0-1),shard:4"); the default partition carries a '*'. A partition
whose nodes differ is taken at its largest node: a packed job fits where some node holds it.
"""
from __future__ import annotations

import re
from typing import Dict, Optional

from hpc.slurm.cli import run

SINFO = ["sinfo", "-h", "-o", "%P %G"]
# gpu:8, gpu:a100:8, gpu:a100:8(S:0-1); a shard or mps count is no GPU
GPU = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def parse(text: str) -> Dict[str, int]:
    """partition -> the most GPUs one of its nodes has (0: none), '' -> the default partition's."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        name, _, gres = line.strip().partition(" ")
        if not name:
            continue
        gpus = max([int(n) for n in GPU.findall(gres.strip())] or [0])
        for key in {name.rstrip("*"), *([""] if name.endswith("*") else [])}:
            out[key] = max(out.get(key, 0), gpus)
    return out


def node_gpus(partition: Optional[str]) -> Optional[int]:
    """GPUs per node of `partition` (None: the default one); None when sinfo cannot say."""
    try:
        found = parse(run(SINFO, timeout_s=5, deadline_s=3))  # a plan waits for it: no long retries
    except (RuntimeError, OSError):
        return None
    return found.get(partition or "")
