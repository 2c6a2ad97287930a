"""A task's own start-up CPU, and hpc's share of it: the batch step (bash, then `python -m hpc.afterstep`
around srun) and the task step (submitit's entry point, then hpc.pipeline.executor.StageTask with a
target that does nothing).

    python -m bench --only task-startup

Each figure is CPU (user+sys) measured inside one fresh interpreter per try, the smallest of TRIES:
the interpreter's own start (`python -c pass`), hpc.afterstep's imports, submitit's task entry
imports (`submitit.core._submit`), then the StageTask call (hpc's imports, the config read, the done
marker). Byte code is cached, as in an installed package. No scheduler is needed.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from bench.common import Context, child_env, fmt_s
from bench.report import Section

TRIES = 10
QUICK_TRIES = 3
TARGET_S = 0.06  # hpc's share of a task's start-up, batch step and task step together (0.12 s before)
TASK = """
import json, sys, time
sys.path.insert(0, {where!r})
t0 = time.process_time()
import submitit.core._submit
t1 = time.process_time()
from hpc.pipeline.executor import StageTask
StageTask({run!r}, "s", "noop_target:main")()
t2 = time.process_time()
print(json.dumps([t1 - t0, t2 - t1]))
"""
WRAPPER = ("import json, time; t0 = time.process_time(); import hpc.afterstep; "
           "print(json.dumps([time.process_time() - t0]))")


def _cpu(argv: List[str], env: Dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def run(ctx: Context) -> Section:
    tries = QUICK_TRIES if ctx.quick else TRIES
    sec = Section("task-startup", "A task's start-up CPU and hpc's share",
                  f"hpc's share within {TARGET_S * 1000:g} ms",
                  "python -m bench --only task-startup" + (" --quick" if ctx.quick else ""),
                  headers=["part", "what", "CPU (min of tries)", "whose"])
    where = Path(tempfile.mkdtemp(dir=ctx.scratch("task-startup")))
    (where / "noop_target.py").write_text("def main(ctx):\n    return 1\n")
    env = child_env({"PYTHONPYCACHEPREFIX": str(where / "pyc")})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    made = ("from hpc.rundir.run import RunDir; from hpc.config import schema; from omegaconf import OmegaConf; "
            f"RunDir({str(where / 'run')!r}).start('x', schema.to_yaml(OmegaConf.create("
            "{'run': {'a': 1, 'b': [1, 2]}, 'tiny': {'c': 'x'}})), 'local')")
    subprocess.run([sys.executable, "-c", made], env=env, check=True)
    code = TASK.format(where=str(where), run=str(where / "run"))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)  # byte code cached
    python = min(_cpu([sys.executable, "-c", "pass"], env) for _ in range(tries))
    bash = min(_cpu(["bash", "-c", "true"], env) for _ in range(tries))
    wrapper, entry, step = 1e9, 1e9, 1e9
    for _ in range(tries):
        out = subprocess.run([sys.executable, "-c", WRAPPER], env=env, check=True, capture_output=True, text=True)
        wrapper = min(wrapper, json.loads(out.stdout)[0])
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
        a, b = json.loads(out.stdout.splitlines()[-1])
        entry, step = min(entry, a), min(step, b)
    sec.rows += [
        ["batch step", "bash", fmt_s(bash), "the shell"],
        ["batch step", "python's own start (hpc.afterstep's interpreter)", fmt_s(python), "Python"],
        ["batch step", "hpc.afterstep's imports", fmt_s(wrapper), "hpc"],
        ["task step", "python's own start", fmt_s(python), "Python"],
        ["task step", "submitit's entry imports (submitit.core._submit)", fmt_s(entry), "submitit"],
        ["task step", "StageTask: hpc's imports, the config read, the done marker", fmt_s(step), "hpc"],
    ]
    share = wrapper + step
    sec.verdicts.append((f"hpc's share: {fmt_s(share)} of {fmt_s(bash + 2 * python + wrapper + entry + step)} "
                         f"(target {TARGET_S * 1000:g} ms)", share <= TARGET_S))
    sec.notes += [
        "srun, slurmstepd and the user's own imports are not counted: they are the same with or without hpc",
        "the task reads its resolved config.yaml without OmegaConf (hpc.config.resolved), and hpc.afterstep "
        "imports nothing of hpc until it must act on a SIGTERM or a failed srun",
        f"{os.cpu_count()} CPU(s); each figure the smallest of {tries} tries, each in a fresh interpreter"]
    return sec


if __name__ == "__main__":
    sys.exit("run it through the harness: python -m bench --only task-startup")
