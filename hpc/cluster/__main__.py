"""Command line for the local cluster.

    python -m hpc.cluster up [--dir DIR] [--nodes N] [--gpus-per-node G] [--cpus-per-node C] [--install]
                             [--configless] [--no-accounting] [--min-job-age S] [--max-array-size N]
                             [--limits] [--max-submit-jobs N]
    python -m hpc.cluster env|status|down [--dir DIR]
    python -m hpc.cluster preempt JOBID [--dir DIR]
    python -m hpc.cluster install
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from hpc.cluster.daemons import ClusterError
from hpc.cluster.install import install_packages
from hpc.cluster.local import LocalCluster
from hpc.cluster.preempt import preempt

DEFAULT_DIR = os.environ.get("HPC_CLUSTER_DIR", str(Path.home() / ".hpc" / "cluster"))


def _up(args: argparse.Namespace) -> None:
    if args.install:
        install_packages()
    LocalCluster(args.dir, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                 cpus_per_node=args.cpus_per_node, port_base=args.port_base, configless=args.configless,
                 accounting=not args.no_accounting, min_job_age_s=args.min_job_age,
                 max_array_size=args.max_array_size, limits=args.limits or None,
                 max_submit_jobs=args.max_submit_jobs).up()


def _down(args: argparse.Namespace) -> None:
    LocalCluster(args.dir).down()


def _env(args: argparse.Namespace) -> None:
    cluster = LocalCluster(args.dir)
    if not cluster.conf.exists():
        raise ClusterError(f"no cluster in {cluster.dir}. HINT: python -m hpc.cluster up --dir {args.dir}")
    if cluster.layout.configless:
        print("unset SLURM_CONF  # configless: no slurm.conf on this site's login nodes")
    for key, value in cluster.env().items():
        print(f"export {key}={shlex.quote(value)}")


def _status(args: argparse.Namespace) -> None:
    print(LocalCluster(args.dir).status())


def _preempt(args: argparse.Namespace) -> None:
    print(preempt(LocalCluster(args.dir), args.job_id, release=not args.no_release))


def _install(args: argparse.Namespace) -> None:
    install_packages()


COMMANDS = {"up": _up, "down": _down, "env": _env, "status": _status, "preempt": _preempt,
            "install": _install}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpc.cluster",
                                     description="A throwaway, real SLURM cluster on this machine.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=DEFAULT_DIR,
                        help=f"directory holding the cluster (default {DEFAULT_DIR}, or $HPC_CLUSTER_DIR)")
    up = sub.add_parser("up", parents=[common], help="start the cluster (idempotent); returns when nodes are idle")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--gpus-per-node", type=int, default=4)
    up.add_argument("--cpus-per-node", type=int, default=8)
    up.add_argument("--port-base", type=int, default=None,
                    help="first of 32 ports (default: from --dir, or the next free block if one of those is in use)")
    up.add_argument("--install", action="store_true", help="apt-get install the SLURM packages first (root)")
    up.add_argument("--configless", action="store_true",
                    help="slurmd and clients fetch the config from slurmctld; the shell gets "
                         "SLURM_CONF_SERVER instead of SLURM_CONF (takes the default munge socket)")
    up.add_argument("--no-accounting", action="store_true", help="no slurmdbd or MariaDB: sacct fails")
    up.add_argument("--min-job-age", type=int, default=600,
                    help="seconds slurmctld keeps an ended job (squeue -t all, scontrol) (default 600)")
    up.add_argument("--max-array-size", type=int,
                    help="MaxArraySize: tasks an array may hold, ids 0 to N-1 (default: as before, else 1001)")
    up.add_argument("--limits", action="store_true",
                    help="enforce associations, limits and QOS (AccountingStorageEnforce), as production sites do")
    up.add_argument("--max-submit-jobs", type=int,
                    help="with --limits: jobs one user may have queued or running (QOS normal's "
                         "MaxSubmitJobsPerUser; each array task counts; 0: no limit)")
    sub.add_parser("down", parents=[common], help="stop every process the cluster started")
    sub.add_parser("env", parents=[common], help="print what a shell of this site exports")
    sub.add_parser("status", parents=[common], help="daemons and sinfo")
    pre = sub.add_parser("preempt", parents=[common], help="preempt a running job with a high-priority job")
    pre.add_argument("job_id")
    pre.add_argument("--no-release", action="store_true",
                     help="leave the requeued job held until SLURM's own begin time (about 2 min)")
    sub.add_parser("install", help="apt-get install slurm-wlm slurmdbd mariadb-server munge (root)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        COMMANDS[args.command](args)
    except (ClusterError, ValueError) as e:
        print(f"hpc.cluster {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
