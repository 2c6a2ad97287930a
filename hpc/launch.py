"""Run an unmodified torchrun-style script as one SLURM task: no torchrun needed.

    srun --nodes=2 --ntasks-per-node=2 python -m hpc.launch -- python train.py --lr 1e-3

The script reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
as torchrun would set them (and OMP_NUM_THREADS=1 with several tasks per node, unless it is set);
this module derives them from SLURM's variables (hpc.runtime.envparse), exports them and replaces itself
with the command (exec: signals from SLURM, such as the SIGTERM of a preemption, reach the script
directly, and its exit status is the task's).

The pre-timeout signal (``--signal=USR2@N``) goes to every process of the step, and its default
action ends the process: an unmodified script would die N seconds before its time limit. The
command therefore starts with that signal ignored, a disposition that survives exec, while a
script that installs its own handler still receives it. A parent may hold the signal blocked
while it starts this module (hpc.scripts.runner does, so that none is lost or fatal in between): it is
unblocked here, once ignored. ``--no-env`` runs a command with this signal set-up only, and
without the torchrun variables an enclosing process may have exported (a one-process script such as
nanoGPT's takes its DDP path whenever RANK is set).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys

from hpc.recovery.stopsignal import DEFAULT_TIMEOUT_SIGNAL, signal_number
from hpc.runtime.devicebind import device_index
from hpc.runtime.distenv import DistEnv, EnvError
from hpc.runtime.envparse import from_environ

__all__ = ["prepare", "main", "ignore_timeout_signal", "without_rank_env"]

# What prepare() exports; `--no-env` takes them out of what the command inherits.
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def ignore_timeout_signal(name: str = DEFAULT_TIMEOUT_SIGNAL) -> None:
    """Ignore the pre-timeout signal unless a handler is set, then unblock it (see docstring)."""
    num = signal_number(name)
    if signal.getsignal(num) == signal.SIG_DFL:
        signal.signal(num, signal.SIG_IGN)  # discards one that arrived while it was blocked
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {num})


def check_devices(env: DistEnv) -> None:
    """torchrun scripts call set_device(LOCAL_RANK): every task must see all node GPUs."""
    index = device_index(env)  # raises on tasks/GPUs mismatches
    if index == 0 and env.local_world_size > 1 and env.local_rank != 0:
        raise EnvError(
            f"task {env.rank} sees one GPU ({env.visible_devices[0]}) but has LOCAL_RANK="
            f"{env.local_rank}: a torchrun-style script would ask for cuda:{env.local_rank}, "
            "which does not exist. HINT: request GPUs per node (--gpus-per-node or --gres) "
            "without --gpus-per-task, so that every task sees all GPUs of its node"
        )


def prepare(environ: dict[str, str]) -> dict[str, str]:
    """The environment the command runs in: the torchrun variables added to `environ`."""
    env = from_environ(environ)
    if env.source == "single" and environ.get("SLURM_JOB_ID"):
        # One task: fine, but say that nothing was distributed in case that is a surprise.
        print("hpc.launch: single task (world size 1)", file=sys.stderr)
    check_devices(env)
    child = dict(environ)
    env.export(child)
    child["GROUP_RANK"] = str(env.node_rank)  # torchrun's name for the node rank
    if env.local_world_size > 1 and "OMP_NUM_THREADS" not in environ:
        # as torchrun does with more than one process per node: without it every rank's OpenMP
        # pool takes all the node's cores, and they oversubscribe them
        print("hpc.launch: OMP_NUM_THREADS=1 for each of this node's "
              f"{env.local_world_size} tasks (set OMP_NUM_THREADS to choose another)", file=sys.stderr)
        child["OMP_NUM_THREADS"] = "1"
    return child


def without_rank_env(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in RANK_VARS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc.launch", description="run a torchrun-style command under srun",
        usage="python -m hpc.launch [--print] [--no-env] [--keep-timeout-signal] [--block-term] "
              "-- COMMAND [ARGS...]")
    parser.add_argument("--print", action="store_true",
                        help="print the exported variables and the command instead of running it")
    parser.add_argument("--no-env", action="store_true",
                        help="no torchrun variables (inherited ones removed): only start the command "
                             "with the pre-timeout signal ignored")
    parser.add_argument("--keep-timeout-signal", action="store_true",
                        help="leave the pre-timeout signal as it is: the script expects it (Lightning "
                             "with requeue_signal=SIGUSR2) and installs its own handler")
    parser.add_argument("--block-term", action="store_true",
                        help="start the script with SIGTERM blocked: the wrapper passes a preemption on as the "
                             "signal its framework saves on (Lightning's USR1), and ends it at the deadline")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given. HINT: python -m hpc.launch -- python train.py ...")
    try:
        if args.keep_timeout_signal:  # the script's own: not ignored, which a framework reads as taken
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal_number(DEFAULT_TIMEOUT_SIGNAL)})
        else:
            ignore_timeout_signal()
        if args.block_term:  # a blocked signal stays blocked across exec; the script's handlers never run
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        child = without_rank_env(dict(os.environ)) if args.no_env else prepare(dict(os.environ))
    except (EnvError, ValueError) as err:
        print(f"hpc.launch: {err}", file=sys.stderr)
        return 2
    if args.print:
        for name in RANK_VARS:
            if name in child:
                print(f"{name}={child[name]}")
        print(shlex.join(command))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, child)
    except OSError as err:
        print(f"hpc.launch: cannot run {command[0]!r}: {err}. HINT: check the command and PATH",
              file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
