"""torchtitan under hpc's `run` wrapper on a GPU: its checkpoints in the task's working directory, an
incomplete step-N set aside before the next launch, and torchtitan resuming from the last complete one
by itself. torchtitan does not train on CPU, so this runs only where CUDA and torchtitan are, from a
torchtitan checkout (HPC_TORCHTITAN_REPO, for its debug model's test tokenizer).

    HPC_TORCHTITAN_REPO=~/torchtitan python -m pytest tests/gpu/test_torchtitan_preset.py
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("torchtitan")
REPO = os.environ.get("HPC_TORCHTITAN_REPO")
if not REPO or not (Path(REPO) / "tests" / "assets" / "tokenizer").exists():
    pytest.skip("HPC_TORCHTITAN_REPO does not name a torchtitan checkout with tests/assets/tokenizer",
                allow_module_level=True)

from hpc.scripts import resume  # noqa: E402
from hpc.scripts.presets import PRESETS  # noqa: E402

TRAIN = [sys.executable, "-m", "hpc.launch", "--", sys.executable, "-m", "torchtitan.train", "--module", "llama3",
         "--config", "llama3_debugmodel", "--training.steps", "20", "--checkpoint.enable",
         "--checkpoint.interval", "5", "--checkpoint.last_save_model_only", "false", "--dump_folder", "outputs"]


def run(work: Path, env: dict, until: Path | None = None) -> subprocess.CompletedProcess | None:
    proc = subprocess.Popen(TRAIN, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if until is None:
        out, _ = proc.communicate(timeout=900)
        return subprocess.CompletedProcess(TRAIN, proc.returncode, out)
    deadline = time.monotonic() + 900
    while not until.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return None


def test_torchtitan_resumes_from_its_last_complete_step_in_the_working_dir(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(Path(REPO) / "tests" / "assets", work / "tests" / "assets")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    ckpts = work / "outputs" / "checkpoint"
    run(work, env, until=ckpts / "step-10" / ".metadata")  # killed after its second checkpoint
    shutil.rmtree(ckpts / "step-10")
    (ckpts / "step-10").mkdir()
    (ckpts / "step-10" / "__0_0.distcp").write_bytes(b"half a shard")  # a kill during its save
    plan = resume.plan(PRESETS["torchtitan"].resume_if, work, tmp_path, {"job": "1", "restart": "0"})
    assert plan["last"] == str(ckpts / "step-5") and plan["set_aside"][0][0].endswith("step-10")
    done = run(work, env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (ckpts / "step-20" / ".metadata").exists()
    assert "step-5" in done.stdout or "step 5" in done.stdout
