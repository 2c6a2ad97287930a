"""What this process sees of its distributed job: rank, world, rendezvous, device.

    python -m hpc.env [--json] [--torch]

Run it inside a job step (`srun python -m hpc.env`) to see what every task of a stage will get.
No torch import unless --torch: it answers in milliseconds.
"""
from __future__ import annotations

import argparse
import json
import sys

from hpc.runtime.devicebind import describe
from hpc.runtime.distenv import EnvError
from hpc.runtime.envparse import from_environ

FIELDS = ("source", "rank", "local_rank", "world_size", "local_world_size", "node_rank", "num_nodes", "master_addr",
          "master_port", "device", "backend", "job_id", "array_job_id", "array_task_id", "restart_count",
          "visible_devices", "hosts")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc.env", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument("--torch", action="store_true",
                        help="import torch to count the CUDA devices this process really sees")
    args = parser.parse_args(argv)
    try:
        info = describe(from_environ(), probe_torch=args.torch)
    except EnvError as err:
        print(f"hpc.env: {err}", file=sys.stderr)
        return 2
    if info["warning"]:
        print(f"hpc.env: warning: {info['warning']}", file=sys.stderr)
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        for key in FIELDS:
            print(f"{key:17} {info[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
