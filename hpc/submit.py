"""Submit a pipeline.

    python -m hpc.submit langsplat --levels 0 1 2 [--cluster auto|slurm|local|debug] [--profile sandbox]
        [--run-dir DIR] [--dry-run] [--wait] [--no-snapshot] [key=value ...]
    python -m hpc.submit run --nodes 2 --gpus-per-node 8 -- python train.py --lr 1e-3
    python -m hpc.submit run --tasks-per-node 2 -- python train.py     # two CPU ranks
    python -m hpc.submit run --no-rank-env -- python train.py          # one process, no RANK/WORLD_SIZE
    python -m hpc.submit run --resume-if 'out/ckpt.pt' --resume-args '--init_from=resume' -- python train.py
    python -m hpc.submit tiny [key=value ...] --sweep tiny.score=1,2 tiny.sleep_s=0,1
    python -m hpc.submit tests.tiny_pipeline --cluster NAME     # a cluster named in clusters.yaml, over ssh

hpc.submit's own options are the engine's; --levels, --nodes, -- COMMAND and the like are the named
pipeline's own (PipelineDef.options, hpc.pipeline.options), shown by --help under that pipeline.
Arguments -> a Request -> hpc.api.submit_request, the API's one way into the submission engine:
hpc.pipeline.submission for a run, hpc.sweep.submission for a grid of runs (--sweep, --sweep-file,
or a sweep's directory). From Python, hpc.submit("langsplat", levels=[0], ...) returns a hpc.Run.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import shlex
import sys
import types
from typing import Any, Dict, List, Mapping, Optional, Sequence

if __name__ == "__main__":  # the command's own process: its imports made with the collector paused (settle)
    gc.disable()

from hpc import api
from hpc.config.checks import CLUSTER_KINDS, ConfigError
from hpc.pipeline import options as hoptions
from hpc.pipeline.pipedef import PIPELINES, PipelineDef, get_pipeline
from hpc.pipeline.request import Request
from hpc.rundir import sweepdir

VALUE_OPTIONS = ("--run-dir", "--profile", "--cluster", "--sweep-file")  # take one value; and a pipeline's own
# What a request loads beyond this module's imports: the engine, and what starts jobs (not for a dry run)
ENGINE, LAUNCH = ("hpc.pipeline.submission",), ("hpc.pipeline.executor", "submitit")


def parse_args(argv: Sequence[str]) -> Request:
    """The command line as a Request; the options of the pipeline it names come from its PipelineDef
    (hpc.pipeline.options). A ConfigError for a pipeline that cannot be loaded or a value that does
    not convert."""
    argv = list(argv)
    command: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    pipes = pipelines_named(argv)
    p = parser(pipes)
    own = [opt for pipe in pipes.values() for opt in pipe.options]
    # key=value tokens are taken out first, so `--levels 0 1 a.b=c` does not read a.b=c as a level;
    # the value of an option (--run-dir /data/a=b) is never one
    overrides, rest, sweep, in_sweep, tokens = [], [], None, False, iter(argv)
    for a in tokens:
        in_sweep = a == "--sweep" or (in_sweep and not a.startswith("-"))
        if a == "--sweep":
            sweep = sweep or []
        elif in_sweep:  # every token after --sweep up to the next option is an axis
            sweep.append(a)
        elif a in VALUE_OPTIONS + hoptions.one_token_flags(own):
            value = next(tokens, None)  # `--opt=value`: argparse then takes a value that starts with '-'
            rest.append(a if value is None else f"{a}={value}")
        else:
            (overrides if "=" in a and not a.startswith("-") else rest).append(a)
    args = p.parse_args(rest)
    if api.named_cluster(args.cluster):
        from hpc.remote import clusters  # a named cluster's only: a local submission never loads hpc.remote

        clusters.find(args.cluster)  # an unknown name: refused with the closest names
    pipe = pipes[args.pipeline]
    given = {opt.name: getattr(args, opt.name) for opt in pipe.options if opt.form != hoptions.REST}
    tail = [opt.name for opt in pipe.options if opt.form == hoptions.REST]
    if command and not tail:
        raise ConfigError(f"a command after '--' ({shlex.join(command)}); pipeline {args.pipeline!r} takes none. "
                          "HINT: drop it, or submit it with the run pipeline: python -m hpc.submit run -- CMD")
    given.update({name: command for name in tail})
    return Request(args.pipeline, overrides=tuple(args.overrides + overrides), profile=args.profile,
                   cluster=args.cluster, run_dir=args.run_dir, options=hoptions.read(pipe.options, given, cli=True),
                   dry_run=args.dry_run, wait=args.wait, no_snapshot=args.no_snapshot,
                   same_snapshot=args.same_snapshot, sweep=tuple(sweep) if sweep is not None else None,
                   sweep_file=args.sweep_file)


def pipelines_named(argv: Sequence[str]) -> Dict[str, PipelineDef]:
    """The pipeline the command line names (its first word that is no option, no key=value and no
    option's value), loaded; none named (--help alone): every registered one, for the help."""
    tokens = iter(argv)
    for a in tokens:
        if a in VALUE_OPTIONS:
            next(tokens, None)
        elif not a.startswith("-") and "=" not in a:
            return {a: get_pipeline(a)}
    return {name: get_pipeline(name) for name in PIPELINES}


def parser(pipes: Mapping[str, PipelineDef]) -> argparse.ArgumentParser:
    """hpc.submit's own options, then each named pipeline's in a group of its own."""
    p = argparse.ArgumentParser(prog="python -m hpc.submit", description=__doc__.split("\n\n")[0])
    p.add_argument("pipeline", help=f"one of {sorted(PIPELINES)}, or a module path (mypkg.pipeline)")
    p.add_argument("overrides", nargs="*", help="dotted key=value config overrides, anywhere before --")
    p.add_argument("--cluster", help=f"where to run: one of {', '.join(CLUSTER_KINDS)} or a cluster named in "
                   "~/.config/hpc/clusters.yaml (docs/remote.md) (default: config, auto)")
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
    seen: set = set()
    for name, pipe in pipes.items():
        mine = [opt for opt in pipe.options if opt.cli not in seen]  # the help for all: a flag once
        if mine:
            group = p.add_argument_group(f"options of the {name} pipeline", hoptions.rest_help(mine) or None)
            hoptions.add_to(group, mine)
            seen.update(opt.cli for opt in mine)
    return p


def main(argv: Optional[Sequence[str]] = None, own_process: bool = False) -> int:
    """The command; `own_process`: the process ends with it (python -m hpc.submit), see settle."""
    try:
        req = parse_args(sys.argv[1:] if argv is None else argv)
        if own_process:
            settle(req)
        done = api.submit_request(req)  # the API's engine call: hpc.submit(...) goes the same way
    except (ConfigError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # --cluster here: the steps stopped at their checkpoints (hpc.here)
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
    from hpc.monitor import table  # only to follow (as above)
    from hpc.rundir.run import RunDir

    return table.follow(RunDir(done.path))


class _Callable(types.ModuleType):
    """hpc.submit is this command and the API's function at once: hpc.submit("langsplat", ...)
    is hpc.api.submit (hpc.submit.main stays the command)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return api.submit(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable

def settle(req: Request) -> None:
    """The command's process ends with its submission, so what its imports make (hpc's modules, the
    engine's, submitit's) lives until the end: made with the collector paused, then frozen
    (gc.freeze), it is walked by no later collection nor by the interpreter's at exit, about a tenth
    of a submission's CPU (BENCHMARKS.md, section 1). hpc.submit() leaves its caller's collector be."""
    if not api.named_cluster(req.cluster):  # a named cluster's submission runs on its login node
        for name in ENGINE + (() if req.dry_run else LAUNCH):
            importlib.import_module(name)
    gc.freeze()
    gc.enable()


if __name__ == "__main__":
    sys.exit(main(own_process=True))
