"""Submit a pipeline.

    python -m hpc.submit langsplat --levels 0 1 2 [--cluster auto|slurm|local|debug] [--profile sandbox]
        [--run-dir DIR] [--dry-run] [--wait] [--no-snapshot] [key=value ...]
    python -m hpc.submit run --nodes 2 --gpus-per-node 8 -- python train.py --lr 1e-3
    python -m hpc.submit run --tasks-per-node 2 -- python train.py     # two CPU ranks
    python -m hpc.submit run --no-rank-env -- python train.py          # one process, no RANK/WORLD_SIZE
    python -m hpc.submit run --resume-if 'out/ckpt.pt' --resume-args '--init_from=resume' -- python train.py
    python -m hpc.submit tiny [key=value ...] --sweep tiny.score=1,2 tiny.sleep_s=0,1

Arguments -> a Request -> hpc.api.submit_request, the API's one way into the submission engine:
hpc.pipeline.submission for a run, hpc.sweep.submission for a grid of runs (--sweep, --sweep-file,
or a sweep's directory). From Python, hpc.submit("langsplat", levels=[0], ...) returns a hpc.Run.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import types
from typing import Any, List, Optional, Sequence

from hpc import api
from hpc.config.checks import CLUSTER_KINDS, ConfigError
from hpc.pipeline.plan import PIPELINES
from hpc.pipeline.request import Request
from hpc.rundir import sweepdir

VALUE_OPTIONS = ("--run-dir", "--profile", "--cluster", "--nodes", "--gpus-per-node", "--tasks-per-node",
                 "--sweep-file", "--resume-if", "--resume-args", "--warn-signal", "--framework", "--accelerate-config",
                 "--hang-after", "--heartbeat")  # take one value


def parse_args(argv: Sequence[str]) -> Request:
    argv = list(argv)
    command: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="python -m hpc.submit", description=__doc__.split("\n\n")[0])
    p.add_argument("pipeline", help=f"one of {sorted(PIPELINES)}, or a module path (mypkg.pipeline)")
    p.add_argument("overrides", nargs="*", help="dotted key=value config overrides, anywhere before --")
    p.add_argument("--levels", nargs="+", type=int,
                   help="LangSplat feature levels 0-3 (default: 1 2 3 in external mode, 0 1 2 synthetic)")
    p.add_argument("--nodes", help="run: nodes per job, or a range MIN-MAX (e.g. 1-2)")
    p.add_argument("--gpus-per-node", type=int, help="run: GPUs (and ranks) per node")
    p.add_argument("--tasks-per-node", type=int,
                   help="run: processes (ranks) per node; without --gpus-per-node they are CPU ranks (no GPUs)")
    p.add_argument("--no-rank-env", action="store_true",
                   help="run: export no RANK/WORLD_SIZE/MASTER_* variables (a one-process script that would "
                        "otherwise take its DDP path)")
    p.add_argument("--resume-if", metavar="GLOB",
                   help="run: the script's checkpoints, relative to its working directory; before each launch "
                        "incomplete ones are set aside and --resume-args added if a complete one is left")
    p.add_argument("--resume-args", metavar="ARGS",
                   help="run: arguments added when --resume-if matches a complete checkpoint, in one quoted "
                        "string ('--resume_from_checkpoint $HPC_LAST_CHECKPOINT')")
    p.add_argument("--framework", choices=("auto", "lightning", "hf", "accelerate", "torchtitan", "none"),
                   help="run: the script's framework preset (default auto: from the script's imports)")
    p.add_argument("--accelerate-config", metavar="FILE",
                   help="run, framework accelerate: the `accelerate config` file whose settings every rank gets "
                        "(default: Accelerate's own default file, if there is one)")
    p.add_argument("--hang-after", type=float, metavar="SECONDS",
                   help="run: no progress in rank 0's output this long is a hang: stacks of every rank, then a "
                        "requeue (default 1800; 0: off; before the first progress: at least 300)")
    p.add_argument("--heartbeat", metavar="REGEX",
                   help="run: progress is a new line of rank 0's output matching this, not any output")
    p.add_argument("--warn-signal", choices=("TERM", "USR1", "USR2", "none"),
                   help="run: the signal the script gets when its time limit is near (default TERM)")
    p.add_argument("--cluster", choices=CLUSTER_KINDS, help="where to run (default: config, auto)")
    p.add_argument("--profile", help="cluster profile from templates/profiles/")
    p.add_argument("--run-dir", help="run directory; an existing one resumes (done tasks are skipped)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and sbatch scripts only")
    p.add_argument("--wait", action="store_true", help="follow the jobs until they end")
    p.add_argument("--sweep", nargs="*", metavar="KEY=V1,V2",
                   help="run the grid of these values, each stage as one array job; "
                        "every token after it up to the next option is an axis")
    p.add_argument("--sweep-file", help="a YAML grid (key: [values]) for --sweep")
    p.add_argument("--no-snapshot", action="store_true",
                   help="run the jobs from the live tree, not a copy of the code taken now (run.snapshot=false)")
    p.add_argument("--same-snapshot", action="store_true",
                   help="resubmit with the code snapshot the run's last submission took, not the live code "
                        "(what hpc's own resubmissions do)")
    # key=value tokens are taken out first, so `--levels 0 1 a.b=c` does not read a.b=c as a level;
    # the value of an option (--run-dir /data/a=b) is never one
    overrides, rest, sweep, in_sweep, tokens = [], [], None, False, iter(argv)
    for a in tokens:
        in_sweep = a == "--sweep" or (in_sweep and not a.startswith("-"))
        if a == "--sweep":
            sweep = sweep or []
        elif in_sweep:  # every token after --sweep up to the next option is an axis
            sweep.append(a)
        elif a in VALUE_OPTIONS:
            value = next(tokens, None)  # `--opt=value`: argparse then takes a value that starts with '-'
            rest.append(a if value is None else f"{a}={value}")
        else:
            (overrides if "=" in a and not a.startswith("-") else rest).append(a)
    args = p.parse_args(rest)
    return Request(args.pipeline, overrides=tuple(args.overrides + overrides), profile=args.profile,
                   cluster=args.cluster, run_dir=args.run_dir, levels=tuple(args.levels) if args.levels else None,
                   nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                   tasks_per_node=args.tasks_per_node, rank_env=not args.no_rank_env, resume_if=args.resume_if,
                   resume_args=tuple(shlex.split(args.resume_args)) if args.resume_args else None,
                   warn_signal=args.warn_signal, framework=args.framework,
                   accelerate_config=args.accelerate_config, hang_after_s=args.hang_after,
                   heartbeat=args.heartbeat, command=tuple(command),
                   dry_run=args.dry_run, wait=args.wait, no_snapshot=args.no_snapshot,
                   same_snapshot=args.same_snapshot, sweep=tuple(sweep) if sweep is not None else None,
                   sweep_file=args.sweep_file)


def main(argv: Optional[Sequence[str]] = None) -> int:
    req = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        done = api.submit_request(req)  # the API's engine call: hpc.submit(...) goes the same way
    except (ConfigError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # --cluster here: the steps stopped at their checkpoints (hpc.pipeline.here)
        return 130
    except OSError as err:  # the run dir's file system: full, read-only, gone
        print(f"error: {err}; expected a writable run directory. HINT: free space or pass another --run-dir.",
              file=sys.stderr)
        return 2
    if not done.jobs or not (req.wait or done.kind != "slurm"):
        return 0
    if sweepdir.is_sweep(str(done.path)):
        from hpc.monitor import sweeps  # only to follow: the table's modules stay off a plain submission

        return sweeps.follow(sweepdir.SweepDir(done.path))
    from hpc.monitor import status  # only to follow (as above)
    from hpc.rundir.run import RunDir

    return status.follow(RunDir(done.path))


class _Callable(types.ModuleType):
    """hpc.submit is this command and the API's function at once: hpc.submit("langsplat", ...)
    is hpc.api.submit (hpc.submit.main stays the command)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return api.submit(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable

if __name__ == "__main__":
    sys.exit(main())
