"""What a real submission loads, from the command or hpc.submit(): the launch path, no other path's modules.

    python -m pytest tests/slurm/test_submission_path.py -m slurm

A submission's CPU is mostly imports (BENCHMARKS.md, section 1): the monitor, the job's own runtime,
containers, --cluster here, sweeps and hpc.status's comparison of the live tree load only where they
are used, and a config read back from the cache needs neither OmegaConf nor yaml.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.slurm.test_pipeline import ROOT

pytestmark = pytest.mark.slurm
# Modules of other paths: following or attaching to a run, the job's side, containers, --cluster here,
# sweeps, hpc.status's drift, a job's notifications, LangSplat's external mode, a config build, a misspelt key.
ELSEWHERE = ("hpc.runs", "hpc.monitor", "hpc.runtime.distenv", "hpc.runtime.envparse", "hpc.recovery",
             "hpc.config.resolved", "hpc.container.carry", "hpc.container.squash", "hpc.here", "hpc.sweep",
             "hpc.rundir.codedrift", "hpc.rundir.notify",
             "hpc.jobs.langsplat.external", "omegaconf", "yaml", "difflib", "unicodedata", "sysconfig")
COMMAND = """
import runpy, sys
sys.argv = ["hpc.submit", "langsplat", "--levels", "0", "1", "2", "--profile", "sandbox", "--run-dir", sys.argv[1]]
try:
    runpy.run_module("hpc.submit", run_name="__main__", alter_sys=True)
except SystemExit as done:
    assert not done.code, done.code
"""
API = """
import sys, hpc
hpc.submit("langsplat", levels=[0, 1, 2], profile="sandbox", run_dir=sys.argv[1])
"""
LOADED = """
print("LOADED", sorted({m for m in sys.modules for e in ELSEWHERE if m == e or m.startswith(e + ".")}))
"""


# hpc.submit() returns a Run (hpc.runs), which loads the monitor only at its first look at the tasks, and
# hpc.remote to attach over ssh; the command loads no named cluster's module (hpc.remote) either
@pytest.mark.parametrize("how,expected,also", [(COMMAND, [], ("hpc.remote",)), (API, ["hpc.runs"], ())],
                         ids=["command", "api"])
def test_a_real_submission_loads_the_launch_path_alone(slurm_cluster, tmp_path, how, expected, also):
    env = {**os.environ, "HPC_CACHE_DIR": str(tmp_path / "cache")}
    script = f"ELSEWHERE = {ELSEWHERE + also!r}\n{how}{LOADED}"
    loaded = []
    for name in ("first", "second"):  # the first builds the config (OmegaConf), the second reads it back
        run_dir = tmp_path / name
        done = subprocess.run([sys.executable, "-c", script, str(run_dir)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        tasks = json.loads((run_dir / "manifest.json").read_text())["tasks"] if done.returncode == 0 else {}
        subprocess.run(["scancel", *[t["job_id"] for t in tasks.values()]], check=False)
        assert done.returncode == 0, done.stderr
        loaded.append(next(line for line in done.stdout.splitlines() if line.startswith("LOADED")))
    assert loaded[1] == f"LOADED {expected}"
