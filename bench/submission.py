"""Submission wall time: `python -m hpc.submit langsplat --levels 0 1 2`, dry-run and real, against
the same two jobs (rgb, then a 3-task features array after it) submitted with bare sbatch calls
and with plain submitit, all on the benchmark's local SLURM cluster.

    python -m bench --only submission
    python bench/plain_submitit.py FOLDER      # the plain-submitit comparison, one run

Each figure is the wall time of the whole command, interpreter start included, as a user sees it;
the variants are interleaved and the median of the repeats is kept. The nodes are drained while
this runs so that the submitted jobs stay pending (they are cancelled afterwards) and no training
competes with the measurement. The commands run from this checkout, so a real submission snapshots
it (hpc.rundir.snapshot); `--no-snapshot` beside it, and the snapshot alone (a first copy into a run root's
store, a link into another root's, and a run dir that runs its root's snapshot of the same files as it
is), say what the snapshot costs.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, List

from bench.common import REPO, Context, best_effort, fmt_s, median
from bench.common import timed as timed_wall
from bench.interleave import paired_ratio
from bench.report import Section
from bench.snapshot_cost import cpu, snapshot_cost
from hpc.rundir.codefiles import GIT_FILES
from hpc.rundir.codeversion import GIT_HEAD
from hpc.slurm.siteconfig import SHOW_CONFIG

TARGET_S = 0.5
TARGET_RATIO = 1.25  # hpc's real submission over plain submitit's, in CPU time (the wall-time ratio too)
API_RATIO = 1.05  # the same submission through the Python API (hpc.submit) over the command's
DRY_S = 0.3
SNAPSHOT_BUDGET_S = 0.1  # the code snapshot's share of TARGET_S, for this repository
REPEATS = 12
# The external commands a real submission may run besides sbatch, the very command lines hpc runs:
# timed in the same rounds, for the note on where hpc's time goes.
PROBES = {"git rev-parse": GIT_HEAD, "scontrol show config": SHOW_CONFIG, "git ls-files": GIT_FILES}
LEVELS = ["0", "1", "2"]
IMPORT_SUBMITIT = "import submitit"
# every module a real submission of LangSplat imports: the command, the engine, the pipeline, submitit
IMPORT_HPC = "import hpc.submit, hpc.pipeline.submission, hpc.pipeline.executor, hpc.jobs.langsplat.pipeline, submitit"
PLAIN = [sys.executable, str(REPO / "bench" / "plain_submitit.py")]  # the baseline: submitit alone
API = "import hpc; hpc.submit('langsplat', levels=[0, 1, 2], profile='sandbox', run_dir={run_dir!r})"
# The sandbox profile's resources (templates/profiles/sandbox.yaml), spelled as sbatch options.
RGB_OPTS = ["-p", "low", "-N", "1", "--ntasks-per-node=1", "--cpus-per-task=1", "--gpus-per-node=1",
            "-t", "20", "--requeue", "--signal=USR2@90"]
FEATURES_OPTS = ["-p", "low", "-N", "2", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=2",
                 "-t", "20", "--requeue", "--signal=USR2@90"]


def bare_sbatch_script(folder: Path) -> str:
    """The same two submissions as a shell script of sbatch calls (--wrap: no script file)."""
    rgb = " ".join(["sbatch", "--parsable", "-J", "rgb", "-o", f"{folder}/rgb-%j.out", *RGB_OPTS])
    feats = " ".join(["sbatch", "--parsable", "-J", "features", f"--array=0-{len(LEVELS) - 1}",
                      "-o", f"{folder}/features-%A_%a.out", *FEATURES_OPTS])
    return (f"set -e\njid=$({rgb} --wrap 'python3 -c pass')\n"
            f"{feats} --dependency=afterok:$jid --wrap 'srun python3 -c pass'\n")


def _cancel_all(cluster) -> None:
    ids = cluster.run(["squeue", "-h", "-o", "%A"], check=False).stdout.split()
    if ids:
        cluster.run(["scancel", *sorted(set(ids))], check=False)


def run(ctx: Context) -> Section:
    sec = Section("submission", "Submission wall time",
                  f"a real submission within {TARGET_S} s and at most {TARGET_RATIO}x plain submitit's CPU; "
                  f"a dry run within {DRY_S} s",
                  "python -m bench --only submission" + (" --quick" if ctx.quick else ""),
                  headers=["variant", "command", "median wall", "median CPU", "runs"])
    cluster = ctx.cluster()
    env = ctx.slurm_env()
    load = os.getloadavg()
    nodes = ",".join(cluster.nodes)
    cluster.run(["scontrol", "update", f"NodeName={nodes}", "State=DRAIN", "Reason=bench-submission"])
    try:
        times = _measure(ctx, env, cluster, repeats=3 if ctx.quick else REPEATS)
    finally:
        _cancel_all(cluster)
        best_effort(lambda: cluster.run(["scontrol", "update", f"NodeName={nodes}", "State=RESUME"]))
    hpc = "python -m hpc.submit langsplat --levels 0 1 2 --profile sandbox --run-dir R"
    snap = snapshot_cost(ctx, repeats=3 if ctx.quick else REPEATS)
    labels = {
        "hpc real": f"`{hpc}`",
        "hpc real, no snapshot": f"`{hpc} --no-snapshot`",
        "hpc API": f"`python -c \"{API.format(run_dir='R')}\"` (the same submission through the Python API)",
        "hpc dry-run": f"`{hpc} --dry-run`",
        "bare sbatch": "`bash -c 'sbatch ...; sbatch --array=0-2 --dependency=afterok:...'` (2 sbatch calls)",
        "plain submitit": "`python bench/plain_submitit.py F` (SlurmExecutor, executor.batch(); imports submitit alone)",
        "python start": "`python -c pass` (interpreter start alone)",
        "import submitit": f"`python -c '{IMPORT_SUBMITIT}'` (interpreter start and plain submitit's one import)",
        "hpc's imports": f"`python -c '{IMPORT_HPC}'` (interpreter start and every module a real submission "
                         "imports, submitit's included)",
    }
    for name, label in labels.items():
        sec.rows.append([name, label, fmt_s(median(times[name])), fmt_s(median(times[f"{name} cpu"])),
                         str(len(times[name]))])
    for name, label in (("snapshot copy", "`hpc.rundir.snapshot.take` of this checkout into a new run dir, nothing "
                                          "snapshotted before (in process)"),
                        ("snapshot linked", "the same, into a new run dir under another root: hard links to "
                                            "the first in that root's store (hpc.rundir.snapcache)"),
                        ("snapshot reused", "the same, into another new run dir of the first's root: its "
                                            "store's snapshot of the same files, run as it is")):
        sec.rows.append([name, label, fmt_s(median(snap[name])), fmt_s(median(snap[f"{name} cpu"])),
                         str(len(snap[name]))])
    real = median(times["hpc real"])
    sec.verdicts.append((f"real submission of 2 jobs (1 + array of 3) took {fmt_s(real)} "
                         f"(target {TARGET_S} s); plain submitit {fmt_s(median(times['plain submitit']))}, "
                         f"bare sbatch {fmt_s(median(times['bare sbatch']))}", real <= TARGET_S))
    rounds = [{"submitit": [[a]], "hpc": [[b]]} for a, b in zip(times["plain submitit"], times["hpc real"])]
    est = paired_ratio(rounds, "submitit", "hpc")
    sec.verdicts.append((f"hpc real / plain submitit, the same two jobs: {est.text()} (per-round pairs, "
                         f"{est.pairs} rounds; target {TARGET_RATIO}x): {est.verdict(TARGET_RATIO)}",
                         est.hi <= TARGET_RATIO))
    cpu = [{"submitit": [[a]], "hpc": [[b]]} for a, b in zip(times["plain submitit cpu"], times["hpc real cpu"])]
    est = paired_ratio(cpu, "submitit", "hpc")
    sec.verdicts.append((f"the same in CPU time (user + system of the command and its children, which load "
                         f"does not stretch): {est.text()}: {est.verdict(TARGET_RATIO)}", est.hi <= TARGET_RATIO))
    api = [{"cli": [[a]], "api": [[b]]} for a, b in zip(times["hpc real cpu"], times["hpc API cpu"])]
    est = paired_ratio(api, "cli", "api")
    sec.verdicts.append((f"the Python API / the command, the same submission, in CPU time: {est.text()} "
                         f"(target {API_RATIO}x: one engine, the same work): {est.verdict(API_RATIO)}",
                         est.hi <= API_RATIO))
    copy = median(snap["snapshot copy"])
    sec.verdicts.append((f"the code snapshot of this repository ({snap['files']} files, {snap['mb']:.1f} MB) took "
                         f"{fmt_s(copy)} ({fmt_s(median(snap['snapshot copy cpu']))} of CPU) to copy and "
                         f"{fmt_s(median(snap['snapshot reused']))} to reuse, "
                         f"{fmt_s(median(snap['snapshot linked']))} to link into a new run dir "
                         f"(budget {fmt_s(SNAPSHOT_BUDGET_S)}); a submission with it {fmt_s(real)} "
                         f"({fmt_s(median(times['hpc real cpu']))} of CPU), without it "
                         f"{fmt_s(median(times['hpc real, no snapshot']))} "
                         f"({fmt_s(median(times['hpc real, no snapshot cpu']))} of CPU)", copy <= SNAPSHOT_BUDGET_S))
    sec.notes.append(critical_path_note(times))
    sec.notes.append(where_note(times))
    dry, dry_cpu = median(times["hpc dry-run"]), median(times["hpc dry-run cpu"])
    sec.verdicts.append((f"dry run took {fmt_s(dry)}, {fmt_s(dry_cpu)} of CPU (target {DRY_S} s on a quiet "
                         f"machine; load at the start {' '.join(f'{x:.1f}' for x in load)}: on a quiet machine "
                         "the wall time is close to the CPU time)", dry <= DRY_S))
    sec.notes += [
        "wall time of the whole command including the Python interpreter start; the nodes are drained "
        "so the submitted jobs stay pending and are cancelled after each round",
        "hpc real also creates the run directory (manifest.json, config.yaml), reads the resolved config and "
        "snapshots this checkout (git ls-files, then the previous round's snapshot of the same files in the "
        "run root's store, run as it is, hpc.rundir.snapcache; a copy of each file, hashed as it is read, when "
        "nothing was snapshotted before); "
        "one warm-up round, dropped, writes the bytecode and hpc's user cache (the resolved config, "
        "hpc.config.cache; the newest snapshot), which every round after it reads, as a user's second "
        "submission does; the dry-run renders the sbatch scripts through submitit without calling sbatch",
        "the command's process ends with its submission, so it makes its imports with the garbage collector "
        "paused and then freezes them (hpc.submit.settle, gc.freeze): no later collection, nor the interpreter's "
        "at exit, walks them again. hpc.submit() runs in its caller's process, whose objects hpc leaves to the "
        "caller's collector: the API's CPU over the command's is mostly those walks (the interpreter's at exit: about 7% of the API's instructions)"]
    return sec


def where_note(times: Dict[str, List[float]]) -> str:
    """hpc's CPU beyond plain submitit's, from this run's medians, split into its imports, the code
    snapshot and the rest."""
    m = {k: median(v) for k, v in times.items()}
    probes = ", ".join(f"{name} {fmt_s(m[name])}" for name in PROBES)
    imports = m["hpc's imports cpu"] - m["import submitit cpu"]
    snap = m["hpc real cpu"] - m["hpc real, no snapshot cpu"]
    rest = m["hpc real, no snapshot cpu"] - m["hpc's imports cpu"] - (m["plain submitit cpu"] - m["import submitit cpu"])
    return ("where hpc's CPU goes beyond plain submitit's: bench/profiles/submission-dry-run.txt and submission-real.txt "
            "(python -m bench.profile submission[-real]). hpc's real submission does all that plain submitit does "
            "(interpreter start, import submitit, 2 sbatch calls: submitit's own submission code) and, on top "
            f"of it, in this run's medians: imports its own modules ({fmt_s(imports)}: hpc's imports less `import "
            "submitit`; the pipeline's definition and config schema, the launch path, the snapshot's modules, most of "
            "it spent creating their dataclasses; not the monitor, the job's runtime, containers, --cluster here or "
            f"sweeps: tests/slurm/test_submission_path.py), takes the code snapshot ({fmt_s(snap)}: hpc real less "
            "hpc real, no snapshot; `git ls-files`, an lstat per file, and the newest listing of the tree read and "
            "compared: the run root's store already holds a snapshot of the same files), and the rest "
            f"({fmt_s(rest)}: the command line, the config read back from hpc.config.cache as plain data without "
            "OmegaConf or yaml, the checkout's commit read from git's files, the plan, config.yaml and manifest.json "
            f"written durably, the tasks' pickles). The commands it may run, as whole processes: {probes}; "
            "`git rev-parse` only where git's files do not say the commit as git would (hpc.rundir.codeversion: "
            "never in this checkout), `scontrol show config` only once per slurm.conf (hpc.slurm.siteconfig keeps "
            "MaxArraySize while the file keeps its stat, an hour at most), so the rounds after the warm-up run "
            "neither; why the ratio stays above 1.0x: the note 'what bounds the ratio from below'")


def critical_path_note(times: Dict[str, List[float]]) -> str:
    """Plain submitit's time, split: interpreter, its import, its submission; and hpc's beyond it.
    Everything plain submitit does is on hpc's path too, in the same order (submitit is imported
    before its executors submit), so the best hpc could do is to run all of its own work on another
    core meanwhile: a tie with plain submitit, never below it."""
    m = {k: median(v) for k, v in times.items()}
    start, imported, plain, real = m["python start"], m["import submitit"], m["plain submitit"], m["hpc real"]
    hpc_imported = m["hpc's imports"]
    return (f"what bounds the ratio from below: plain submitit's {fmt_s(plain)} is the interpreter "
            f"({fmt_s(start)}), `import submitit` ({fmt_s(imported - start)}) and submitit submitting the two jobs "
            f"({fmt_s(plain - imported)}, 2 sbatch calls included). hpc submits through submitit, so all three "
            f"are on its path too; its imports (submitit's included) take {fmt_s(hpc_imported - start)}, "
            f"and its own work after them (config, plan, git, snapshot, run directory) and "
            f"submitit's submission {fmt_s(real - hpc_imported)}. Even with every part of hpc's own work "
            "moved to another core while submitit imports and submits (a second process: threads share one "
            "interpreter lock), its time would be plain submitit's at best: a tie that needs a free core, and "
            "that this method could not tell from 1.0x within its interval. Below 1.0x only a submission that "
            "does less than plain submitit could go: hpc rendering and calling sbatch itself, without "
            "submitit, which hpc submits through by design")


def _measure(ctx: Context, env: Dict[str, str], cluster, repeats: int) -> Dict[str, List[float]]:
    """Wall times per variant, and under "<variant> cpu" the CPU time (user + system) of the
    command and its children: what the command itself costs, whatever the load."""
    times: Dict[str, List[float]] = {k: [] for k in ("hpc real", "hpc API", "hpc real, no snapshot", "hpc dry-run",
                                                     "bare sbatch", "plain submitit", "python start",
                                                     "import submitit", "hpc's imports", *PROBES)}
    times.update({f"{k} cpu": [] for k in list(times)})

    def timed(argv: List[str], env: Dict[str, str], name: str) -> float:
        c0 = cpu()
        wall = timed_wall(argv, env=env, cwd=REPO)  # from this checkout, as users submit from theirs
        times[f"{name} cpu"].append(cpu() - c0)
        return wall
    base = ctx.scratch("submission")
    env = bench_env(env, base)
    hpc = [sys.executable, "-m", "hpc.submit", "langsplat", "--levels", *LEVELS, "--profile", "sandbox"]
    for argv in ([*hpc, "--run-dir", str(base / "warm"), "--dry-run"], [*hpc, "--run-dir", str(base / "warm")],
                 [*PLAIN, str(base / "submitit-warm")]):
        timed_wall(argv, env=env, cwd=REPO)  # dropped: writes the bytecode and hpc's cache once
    _cancel_all(cluster)
    for i in range(repeats):  # interleaved: a busy moment on the machine hits every variant
        times["hpc dry-run"].append(timed([*hpc, "--run-dir", str(base / f"dry-{i}"), "--dry-run"], env, "hpc dry-run"))
        times["hpc real"].append(timed([*hpc, "--run-dir", str(base / f"real-{i}")], env, "hpc real"))
        times["hpc API"].append(timed([sys.executable, "-c", API.format(run_dir=str(base / f"api-{i}"))], env,
                                      "hpc API"))
        times["hpc real, no snapshot"].append(timed([*hpc, "--run-dir", str(base / f"bare-{i}"), "--no-snapshot"],
                                                    env, "hpc real, no snapshot"))
        folder = base / f"sbatch-{i}"
        folder.mkdir()
        times["bare sbatch"].append(timed(["bash", "-c", bare_sbatch_script(folder)], env, "bare sbatch"))
        times["plain submitit"].append(
            timed([*PLAIN, str(base / f"submitit-{i}")], env, "plain submitit"))
        times["python start"].append(timed([sys.executable, "-c", "pass"], env, "python start"))
        times["import submitit"].append(timed([sys.executable, "-c", IMPORT_SUBMITIT], env, "import submitit"))
        times["hpc's imports"].append(timed([sys.executable, "-c", IMPORT_HPC], env, "hpc's imports"))
        for name, argv in PROBES.items():
            times[name].append(timed(argv, env, name))
        _cancel_all(cluster)
    _check_submitted(base, repeats)
    return times


def bench_env(env: Dict[str, str], base: Path) -> Dict[str, str]:
    """Every Python variant as a user runs it: bytecode written and read (under the scratch
    directory, not the checkout: PYTHONDONTWRITEBYTECODE in the caller's environment would make
    hpc compile its own modules on every start, where plain submitit's installed ones have theirs),
    and hpc's user cache (hpc.config.cache, hpc.rundir.snapcache) in the scratch directory."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(base / "pycache"), "HPC_CACHE_DIR": str(base / "cache")}


def _check_submitted(base: Path, repeats: int) -> None:
    """The real submissions must have recorded 4 tasks each, or the timing measured a failure."""
    for i in range(repeats):
        for name, snapshotted in ((f"real-{i}", True), (f"api-{i}", True), (f"bare-{i}", False)):
            manifest = json.loads((base / name / "manifest.json").read_text())
            if len(manifest.get("tasks", {})) != 1 + len(LEVELS):
                raise RuntimeError(f"hpc.submit run {name} recorded {len(manifest.get('tasks', {}))} tasks, "
                                   f"expected {1 + len(LEVELS)}; see {base / name}")
            if bool(manifest.get("snapshot")) != snapshotted:
                raise RuntimeError(f"hpc.submit run {name}: snapshot {manifest.get('snapshot')!r}, expected "
                                   f"{'one' if snapshotted else 'none'}; see {base / name}")
