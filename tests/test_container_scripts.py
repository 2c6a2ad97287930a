"""Containers for `run` scripts and sweeps: their dry runs show the container srun line of every
runtime (image, mounts with the run or sweep directory and the carried hpc, container name), and a
script's framework is not looked up in this machine's interpreter when an image runs it, nor does the
script import hpc's carried copies of its requirements over the image's own.
pytest tests/test_container_scripts.py"""
import os
import re
import shlex
import subprocess
import sys

import pytest

from hpc import submit
from hpc.container import carry
from hpc.scripts import hooks, presets

IMAGES = {"pyxis": "nvcr.io#nvidia/pytorch:24.05-py3", "apptainer": "docker://nvcr.io/nvidia/pytorch:24.05-py3"}
BOX = {
    "pyxis": ["cluster.container.runtime=pyxis", f"cluster.container.image={IMAGES['pyxis']}"],
    "apptainer": ["cluster.container.runtime=apptainer", f"cluster.container.image={IMAGES['apptainer']}"],
    "exec": ["cluster.container.runtime=exec", "cluster.container.prefix=[bwrap,--bind,/,/]"],
}


@pytest.fixture
def proj(tmp_path, monkeypatch):
    """A script's directory (the submit directory) and hpc's cache."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("import torch\nprint(torch.__version__)\n")
    (tmp_path / "cache").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def dry_run(capsys, *args):
    code = submit.main(["run", "--dry-run", "--cluster", "slurm", "--tasks-per-node", "2", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def check_srun_line(text, runtime, root, tmp, folder="%j"):
    """The one srun line: the runtime's words, every mount hpc adds, the carried hpc before the runner."""
    (line,) = [s for s in text.splitlines() if s.startswith("srun ")]
    words = shlex.split(line)
    carried = re.search(rf"{re.escape(str(tmp))}/cache/carry/[0-9a-f]{{16}}", text).group(0)
    at = words.index("sh")
    assert words[at + 1] == "-c" and f"export PYTHONPATH={carried}" in words[at + 2]
    assert words[at + 3:] == ["python", "-u", "-m", "submitit.core._submit", f"{root}/main/logs/{folder}"]
    assert f"note: hpc in the containers: a copy of hpc and its pure-Python requirements at {carried}" in text
    if runtime == "exec":
        assert words[at - 4:at] == ["bwrap", "--bind", "/", "/"]
        return
    if runtime == "pyxis":
        assert f"--container-image={IMAGES['pyxis']}" in words and "--no-container-mount-home" in words
        assert any(re.fullmatch(r"--container-name=hpc-[0-9a-f]{12}", w) for w in words)
        mounts = next(w for w in words if w.startswith("--container-mounts=")).partition("=")[2]
    else:
        start = words.index("apptainer")
        assert words[start:start + 3] == ["apptainer", "exec", "--bind"] and words[at - 1] == IMAGES["apptainer"]
        mounts = words[start + 3]
    for path in (root, tmp / "cache", tmp / "proj"):  # run or sweep dir, the carried copy's cache, the script's
        assert f"{path}:{path}" in mounts.split(","), (path, mounts)


@pytest.mark.parametrize("runtime", sorted(BOX))
def test_run_script_dry_run_shows_the_container(proj, capsys, runtime):
    root = proj / "runs" / "r"
    text = dry_run(capsys, "--run-dir", str(root), *BOX[runtime], "--", "python", "train.py")
    assert "each task runs python -m hpc.launch -- python train.py" in text
    check_srun_line(text, runtime, root, proj)


@pytest.mark.parametrize("runtime", sorted(BOX))
def test_sweep_dry_run_shows_the_container(proj, capsys, runtime):
    root = proj / "runs" / "s"
    text = dry_run(capsys, "--run-dir", str(root), *BOX[runtime], "--sweep", "script.warn_signal=TERM,USR1",
                   "--", "python", "train.py")
    assert text.startswith(f"sweep: pipeline run, 2 point(s) -> {root}")
    # the sweep directory: it holds the sweep's one snapshot; the points' tasks are one array, one log folder
    check_srun_line(text, runtime, root, proj, folder="%A")


def test_framework_is_not_looked_up_on_this_machine_for_an_image(proj, capsys):
    """An interpreter here that lacks the framework refuses a plain submission; in an image the
    script runs on the image's interpreter, so the submission goes ahead and the plan says so."""
    python = proj / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\nexit 3\n")  # find_spec found none of the packages (hpc.scripts.checks.FIND)
    python.chmod(0o755)
    command = ["--framework", "lightning", "--", str(python), "train.py"]
    assert submit.main(["run", "--dry-run", "--cluster", "slurm", *command]) == 2
    assert f"framework preset 'lightning' needs lightning or pytorch_lightning, which {python} cannot import" \
        in capsys.readouterr().err
    text = dry_run(capsys, *BOX["pyxis"], *command)
    assert "note: framework preset lightning: whether the image's interpreter imports it is not checked here" in text


def test_a_script_in_an_image_imports_the_images_packages_not_hpcs_carried_copy(tmp_path):
    """The carried copy is first on PYTHONPATH in the container (hpc.container.carry.wrap); in the script
    hpc's sitecustomize moves it behind the image's packages, and hpc is still found there."""
    copy = tmp_path / "carry" / "0123456789abcdef"
    (copy / "hpcmark").mkdir(parents=True)
    (copy / carry.LISTING).write_text("{}")
    (copy / "tqdm.py").write_text("WHERE = 'carried'\n")  # shadows the installed (the image's) tqdm
    (copy / "hpcmark" / "__init__.py").write_text("")  # what only the copy has (hpc, in an image with torch alone)
    inside = f"{copy}:{os.environ.get('PYTHONPATH', '')}"  # as carry.wrap leaves it in the container
    env = {**os.environ, **hooks.environ(presets.PRESETS["none"], tmp_path, inside)}
    script = "import tqdm, hpcmark, sys; print(getattr(tqdm, 'WHERE', 'image'), hpcmark.__file__, sys.path[-1])"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["image", str(copy / "hpcmark" / "__init__.py"), str(copy)]


def test_the_local_executor_says_it_runs_outside_the_container(proj, capsys):
    """Without SLURM the stages run on this machine, and the plan says that the container is not used."""
    for args in ([], ["--sweep", "script.warn_signal=TERM,USR1"]):
        text = dry_run(capsys, "--run-dir", str(proj / "runs" / f"l{len(args)}"), *BOX["exec"], "--cluster", "local",
                       *args, "--", "python", "train.py")
        assert "note: the local executor runs stage(s) main on this machine, outside their container: " in text
        assert "note: hpc in the containers" not in text
