"""What every task loads before its own code: the batch step's srun wrapper (hpc.afterstep) and the
task step (hpc.pipeline.executor.StageTask), counted in modules, and the config the task reads
without OmegaConf read as OmegaConf reads it.

    python -m pytest tests/test_task_startup.py -q
"""
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List

from omegaconf import OmegaConf

from hpc.config import resolved
from hpc.config import schema as hconfig
from hpc.rundir.run import RunDir

ROOT = __file__.rsplit("/tests/", 1)[0]
TRICKY = ["2026-01-01", "2026-01-01 10:00:00", "1e3", "1__2.5", "1_000", "0x1F", "0o17", "1:30", "1:30.5", ".5",
          "yes", "no", "on", "off", "~", "null", "True", ".inf", "-.inf", ".nan", "+1", "-0", "1.0e-05", "a: b",
          "- x", "#x", "x #y", "'q'", '"q"', "???", "", " ", "010", "0b101", "é", "multi\nline"]


@dataclass
class Tricky:
    words: List[str] = field(default_factory=lambda: list(TRICKY))
    by_word: Dict[str, str] = field(default_factory=lambda: {w or "empty": w for w in TRICKY})
    numbers: List[float] = field(default_factory=lambda: [1e-5, 1e300, float("inf"), -0.0, 3.0, 0.1])
    ints: List[int] = field(default_factory=lambda: [0, -1, 10**18])
    flags: List[bool] = field(default_factory=lambda: [True, False])
    nothing: Dict[str, None] = field(default_factory=lambda: {"k": None})


def test_the_task_reads_config_yaml_as_omegaconf_does(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(hconfig.to_yaml(OmegaConf.structured(Tricky)))
    assert resolved.read(path) == OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    # an interpolation left in a hand-written config still resolves
    path.write_text("a: 1\nb: ${a}\n")
    assert resolved.read(path) == {"a": 1, "b": 1}


def test_the_loaders_scalar_rules_are_omegaconfs():
    try:
        from omegaconf._yaml import get_yaml_loader
    except ImportError:  # omegaconf before its _yaml module
        from omegaconf._utils import get_yaml_loader

    def rules(loader):
        return {first: [(tag, re.sub(r"\s+", "", rx.pattern), rx.flags) for tag, rx in found] for first, found in
                loader.yaml_implicit_resolvers.items()}  # verbose patterns: their spaces are no part of them

    assert rules(resolved.loader()) == rules(get_yaml_loader())


def _modules(code: str, cwd=ROOT) -> List[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=cwd, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_the_batch_steps_srun_wrapper_loads_nothing_of_hpc_until_it_must_act():
    """hpc.afterstep runs in every batch step; most only run srun, which its supervision loop
    (hpc.recovery.supervise: the standard library alone) watches (the SIGTERM and failure paths are
    tests/test_nodefail.py's and the SLURM tests')."""
    loaded = _modules("import hpc.afterstep")
    assert [m for m in loaded if m.startswith("hpc.")] == ["hpc.afterstep", "hpc.recovery", "hpc.recovery.supervise"]


def test_a_task_starts_without_omegaconf(tmp_path):
    (tmp_path / "startup_target.py").write_text("def main(ctx):\n    return ctx.cfg['tiny']['score']\n")
    run = RunDir(tmp_path / "run")
    run.start("tiny", hconfig.to_yaml(OmegaConf.create({"tiny": {"score": 1.5, "day": "2026-01-01"}})), "local")
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
            "from hpc.pipeline.executor import StageTask\n"
            f"assert StageTask({str(run.path)!r}, 'first', 'startup_target:main')() == 1.5\n")
    loaded = _modules(code)
    assert "omegaconf" not in loaded and "hpc.config.schema" not in loaded
    assert run.is_done("first")


def test_a_task_runs_again_within_its_own_attempt_and_never_after_its_done_marker_in_a_later_one(tmp_path):
    """Rank 0 may write the done marker before a slower rank of the same step starts: that rank still
    runs. A requeue (SLURM_RESTART_COUNT) or a restart in place (a new SLURM_STEP_ID) finds the
    marker of an earlier attempt and runs nothing."""
    (tmp_path / "counted_target.py").write_text(
        "import os\ndef main(ctx):\n    with open(os.path.join(os.path.dirname(__file__), 'calls'), 'a') as f:\n"
        "        f.write('x')\n    return 7\n")
    run = RunDir(tmp_path / "run")
    run.start("tiny", hconfig.to_yaml(OmegaConf.create({"tiny": {}})), "slurm")
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
            "from hpc.pipeline.executor import StageTask\n"
            f"print('result', StageTask({str(run.path)!r}, 'first', 'counted_target:main')())\n")

    def attempt(restart: str, step: str) -> str:
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
        env.update(SLURM_JOB_ID="77", SLURM_RESTART_COUNT=restart, SLURM_STEP_ID=step)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    calls = tmp_path / "calls"
    assert "result 7" in attempt("0", "0") and calls.read_text() == "x"
    assert "result 7" in attempt("0", "0") and calls.read_text() == "xx"  # the same step's slower rank
    for restart, step in (("0", "1"), ("1", "0")):  # a restart in place, a requeue
        out = attempt(restart, step)
        assert "result 7" in out and "finished already" in out and calls.read_text() == "xx", out
