"""Containers (hpc.container.spec): the srun line of each runtime, the mounts hpc adds, and the
input refused before anything is submitted."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import hpc
from hpc.config import schema as config
from hpc.pipeline import plan
from hpc.runtime.envparse import from_environ

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "dryrun"


@pytest.fixture
def site(tmp_path):
    """An image file, a data directory and a cache directory, all under one temporary path."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "torch.sqsh").write_bytes(b"")
    (tmp_path / "images" / "torch.sif").write_bytes(b"")
    (tmp_path / "data").mkdir()
    (tmp_path / "cache").mkdir()
    return tmp_path


def dry_run(site, *args, run_dir="/RUN"):
    cmd = [sys.executable, "-m", "hpc.submit", "langsplat", "--dry-run", "--run-dir", run_dir, "--cluster", "slurm",
           "--profile", "sandbox", *args]
    env = {**os.environ, "SLURM_CONF": "/nonexistent", "HPC_CACHE_DIR": str(site / "cache")}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)


def srun_lines(text):
    return [line for line in text.splitlines() if line.startswith("srun ")]


CASES = {
    "container_pyxis": ["cluster.container.runtime=pyxis", "cluster.container.image=SITE/images/torch.sqsh",
                        "cluster.container.workdir=/workspace", "cluster.container.env={NCCL_DEBUG: INFO}",
                        "cluster.container.python=/usr/bin/python3", "langsplat.data_path=SITE/data"],
    "container_pyxis_squash": ["cluster.container.runtime=pyxis",
                               "cluster.container.image=nvcr.io#nvidia/pytorch:24.05-py3",
                               "cluster.container.squash=SITE/images/pytorch.sqsh", "cluster.container.hpc=image"],
    "container_apptainer": ["cluster.container.runtime=apptainer", "cluster.container.image=SITE/images/torch.sif",
                            "cluster.container.mounts=[SITE/data:/data:ro]", "stages.rgb.gpus_per_node=0"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_of_a_container_matches_golden(site, name):
    out = dry_run(site, *[a.replace("SITE", str(site)) for a in CASES[name]])
    assert out.returncode == 0, out.stderr
    text = (out.stdout.replace(shlex.quote(sys.executable), "PYTHON").replace(str(site), "SITE")
            .replace(str(ROOT), "CHECKOUT"))
    text = re.sub(r"--container-name=hpc-[0-9a-f]{12}", "--container-name=hpc-HASH", text)  # of the image's path
    text = re.sub(r"/carry/[0-9a-f]{16}", "/carry/KEY", text)  # of hpc's files (hpc.container.carry)
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("HPC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_pyxis_srun_line(site):
    out = dry_run(site, *[a.replace("SITE", str(site)) for a in CASES["container_pyxis"]])
    assert out.returncode == 0, out.stderr
    lines = srun_lines(out.stdout)
    assert len(lines) == 2  # rgb, features
    words = [shlex.split(line) for line in lines]
    for w in words:
        assert f"--container-image={site}/images/torch.sqsh" in w
        mounts = next(a for a in w if a.startswith("--container-mounts=")).partition("=")[2].split(",")
        # the run dir (submitit's folder inside), its root's snapshot store, the cache, the submission dir, the data
        assert {"/RUN:/RUN", "/.hpc-snapshots:/.hpc-snapshots", f"{site}/cache:{site}/cache", f"{ROOT}:{ROOT}",
                f"{site}/data:{site}/data"} == set(mounts)
        assert "--no-container-mount-home" in w and "--container-workdir=/workspace" in w
        assert "--container-env=NCCL_DEBUG" in w
        assert w[w.index("-u") - 1] == "/usr/bin/python3"  # the interpreter inside the image
    names = {next(a for a in w if a.startswith("--container-name=")) for w in words}
    assert len(names) == 2  # one per job, the same on every requeue (a pure function of the run and stage)
    assert "export NCCL_DEBUG=INFO" in out.stdout
    assert out.stdout.count("-m hpc.afterstep /RUN") == 2  # the wrapper stays on the host


def test_apptainer_srun_line(site):
    out = dry_run(site, *[a.replace("SITE", str(site)) for a in CASES["container_apptainer"]])
    assert out.returncode == 0, out.stderr
    rgb, features = (shlex.split(line) for line in srun_lines(out.stdout))
    for w, nv in ((rgb, False), (features, True)):
        at = w.index("apptainer")
        assert w[at:at + 2] == ["apptainer", "exec"] and "--cleanenv" not in w
        assert ("--nv" in w) is nv  # GPUs only where the stage asks for them
        binds = w[w.index("--bind") + 1].split(",")
        assert f"{site}/data:/data:ro" in binds and "/RUN:/RUN" in binds
        at = w.index(f"{site}/images/torch.sif")  # the image, then the interpreter (hpc carried: sh -c ...)
        assert w[at + 1:at + 3] == ["sh", "-c"] and w[at + 4:at + 6] == ["python", "-u"]


def test_exec_prefix_and_a_stage_of_its_own(site):
    out = dry_run(site, "cluster.container.runtime=exec", "cluster.container.prefix=[bwrap,--bind,/,/]",
                  "stages.rgb.container.runtime=pyxis", "stages.rgb.container.image=nvcr.io#nvidia/pytorch:24.05-py3")
    assert out.returncode == 0, out.stderr
    rgb, features = srun_lines(out.stdout)
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in rgb and "bwrap" not in rgb
    assert "--kill-on-bad-exit=1 bwrap --bind / / sh -c " in features
    assert features.endswith(" python -u -m submitit.core._submit /RUN/features/logs/%A")


def test_hpc_is_carried_into_the_image_unless_the_image_has_it(site):
    """container.hpc=carry (the default): every rank's interpreter starts with hpc's copy first on
    PYTHONPATH, in front of the image's own; the note says where. hpc=image: the srun line as it was."""
    out = dry_run(site, "cluster.container.runtime=exec", "cluster.container.prefix=[env]")
    assert out.returncode == 0, out.stderr
    (note,) = [line for line in out.stdout.splitlines() if "note: hpc in the containers" in line]
    carried = re.search(rf"{re.escape(str(site))}/cache/carry/[0-9a-f]{{16}}", note).group(0)
    assert not os.path.exists(carried)  # a dry run makes nothing
    for line in srun_lines(out.stdout):
        words = shlex.split(line)
        at = words.index("env")
        assert words[at + 1:at + 3] == ["sh", "-c"] and words[at + 4] == "python"
        script = words[at + 3]
        env = {**os.environ, "PYTHONPATH": "/image/site"}  # the image's own stays behind the copy
        echo = ["sh", "-c", script, "sh", "-c", 'echo "$PYTHONPATH"']
        shown = subprocess.run(echo, env=env, capture_output=True, text=True).stdout.strip()
        assert shown == f"{carried}:/image/site"
        alone = subprocess.run(echo, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True).stdout.strip()
        assert alone == carried  # no empty entry (the working directory) after it
    out = dry_run(site, "cluster.container.runtime=exec", "cluster.container.prefix=[env]",
                  "cluster.container.hpc=image")
    assert out.returncode == 0, out.stderr
    assert "/carry/" not in out.stdout
    assert all(line.endswith(("env python -u -m submitit.core._submit /RUN/rgb/logs/%j",
                              "env python -u -m submitit.core._submit /RUN/features/logs/%A"))
               for line in srun_lines(out.stdout))


def test_no_container_leaves_the_srun_line_as_it_was(site):
    out = dry_run(site)
    assert out.returncode == 0, out.stderr
    assert all("container" not in line and "apptainer" not in line for line in srun_lines(out.stdout))


@pytest.mark.parametrize("args, seen", [
    (["cluster.container.runtime=docker"], "cluster.container.runtime='docker'"),
    (["cluster.container.runtime=pyxis", "cluster.container.image=SITE/images/nope.sqsh"], "does not exist"),
    (["cluster.container.runtime=apptainer", "cluster.container.image=SITE/images/torch.sif",
      "cluster.container.mounts=[SITE/nope:/nope]"], "source 'SITE/nope' does not exist"),
    (["cluster.container.runtime=pyxis", "cluster.container.image=SITE/images/torch.sqsh",
      "cluster.container.mounts=[SITE/data:/]"], "would hide the run directory"),
    (["cluster.container.runtime=pyxis", "cluster.container.image=SITE/images/torch.sqsh",
      "cluster.container.mounts=[SITE/data:SITE/run/rgb]"], "would hide the run directory"),
    (["stages.rgb.container.runtime=pyxis"], "stages.rgb.container.image is empty"),
    (["cluster.container.runtime=exec"], "cluster.container.prefix"),
    (["cluster.container.runtime=exec", "cluster.container.prefix=[env]", "cluster.container.hpc=pip"],
     "cluster.container.hpc='pip'"),
    (["cluster.container.runtime=exec", "cluster.container.prefix=[env]", "cluster.container.workdir=/w"],
     "mounts or .workdir set with runtime exec"),
])
def test_bad_container_input_is_refused_before_submission(site, args, seen, refused):
    refused(["langsplat", "--run-dir", str(site / "run"), *[a.replace("SITE", str(site)) for a in args]],
            seen.replace("SITE", str(site)))


@pytest.fixture
def refused(site, monkeypatch, capsys):
    """refused(argv, seen): python -m hpc.submit ARGV --cluster slurm --profile sandbox is refused in
    one line with a HINT that holds `seen`, by the dry run and by the submission alike, before a
    snapshot is taken or sbatch runs. SLURM's clients here answer the one question asked before the
    plan (MaxArraySize), and sbatch leaves a mark if it is called."""
    from hpc import submit

    bin_dir = site / "bin"
    bin_dir.mkdir()
    for name, body in (("scontrol", "echo MaxArraySize=1001"), ("sbatch", f"touch {site}/sbatch-called; exit 1"),
                       ("squeue", "exit 0"), ("sacct", "exit 0")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HPC_CACHE_DIR", str(site / "cache"))
    monkeypatch.chdir(ROOT)

    def check(argv, seen):
        lines = []
        for dry in (["--dry-run"], []):
            assert submit.main([*argv, "--cluster", "slurm", "--profile", "sandbox", *dry]) == 2
            err = capsys.readouterr().err.strip()
            assert "\n" not in err and "HINT" in err and seen in err, err
            lines.append(err)
        assert lines[0] == lines[1]
        assert not (site / "sbatch-called").exists() and not list(site.glob("**/code"))
    return check


def test_a_profile_sets_the_container_of_every_stage(site):
    """cluster.container from a profile holds for every stage that names none of its own."""
    from hpc.jobs.langsplat.pipeline import PIPELINE

    (site / "profiles").mkdir()
    (site / "profiles" / "dgx.yaml").write_text(
        f"cluster:\n  container:\n    runtime: pyxis\n    image: {site}/images/torch.sqsh\n")
    templates = Path(plan.__file__).resolve().parents[2] / "templates"
    for name in PIPELINE.templates:
        (site / name).write_text((templates / name).read_text() if (templates / name).exists() else "")
    cfg = config.load(PIPELINE.schema, "langsplat", "dgx", templates=site, extra=PIPELINE.templates, keep=False,
                      settle=PIPELINE.settle)
    jobs = plan.make_plan(PIPELINE, cfg, "/RUN", "slurm").jobs
    assert {j.stage for j in jobs} == {"rgb", "features"}
    for job in jobs:
        assert f"--container-image={site}/images/torch.sqsh" in job.sbatch_text()


def test_rank_variables_of_enroots_pytorch_hook_lose_to_slurms():
    """Enroot's PyTorch hook sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT inside the image;
    in an srun step hpc derives them from SLURM's variables and exports its own over them."""
    hook = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500",
            "PYTORCH_VERSION": "2.4.0"}
    slurm = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1",
             "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
             "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "42"}
    env = from_environ({**hook, **slurm})
    exported = dict(hook)
    env.export(exported)
    assert (exported["RANK"], exported["WORLD_SIZE"], exported["LOCAL_RANK"]) == ("3", "4", "1")
    assert exported["MASTER_ADDR"] == "n1" and exported["MASTER_PORT"] != "29500"


@pytest.mark.parametrize("runtime, arg, path", [
    ("pyxis", "run.root=", "SITE/a:b"),  # the run directory <root>/<run.name> under it
    ("apptainer", "--run-dir", "SITE/run,1"),
    ("pyxis", "langsplat.data_path=", "SITE/my data"),  # a data path in the config, mounted by hpc
    ("pyxis", "langsplat.data_path=", "SITE/d$x"),
    ("pyxis", "cluster.container.mounts=", "SITE/my data"),  # a mount of the user's own
])
def test_a_mount_path_the_runtime_cannot_carry_is_refused(site, runtime, arg, path, refused):
    """',' separates the entries of Pyxis's --container-mounts and Apptainer's --bind and ':' the
    parts of one; Pyxis writes each entry into an `echo "SRC DST FLAGS"` shell line that enroot reads
    as fstab, whose fields whitespace splits (Pyxis 0.24 escapes it, earlier ones do not) and where
    the shell expands $, ` and \\. Such a path is refused in one line that names it."""
    path = path.replace("SITE", str(site))
    if arg.endswith("="):
        os.makedirs(path, exist_ok=True)
    image = f"{site}/images/torch.{'sqsh' if runtime == 'pyxis' else 'sif'}"
    given = {"--run-dir": ["--run-dir", path], "run.root=": [arg + path, "run.name=r"],
             "cluster.container.mounts=": [f"{arg}[{path}:/data]"]}.get(arg, [arg + path])
    refused(["langsplat", *given, f"cluster.container.runtime={runtime}", f"cluster.container.image={image}"],
            repr(path + "/r" * (arg == "run.root=")))


def test_apptainer_mounts_a_path_with_a_space(site):
    """Apptainer takes its --bind list as one word: a space is no separator there."""
    (site / "my data").mkdir()
    out = dry_run(site, "cluster.container.runtime=apptainer", f"cluster.container.image={site}/images/torch.sif",
                  f"langsplat.data_path={site}/my data")
    assert out.returncode == 0, out.stderr
    for words in map(shlex.split, srun_lines(out.stdout)):
        assert f"{site}/my data:{site}/my data" in words[words.index("--bind") + 1].split(",")


def boxed(ctx):
    """A short-form pipeline's stage."""


BOXED = hpc.define("boxed", hpc.stage(boxed, cpus_per_task=1, time_min=5))


def test_a_short_form_run_directory_is_named_after_its_pipeline(site, monkeypatch, capsys):
    """The default run directory <run.root>/<name>-<time> takes the pipeline's name ('boxed'), not
    the module:ATTR it is submitted as, whose ':' would split Pyxis's mount entry of it."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HPC_CACHE_DIR", str(site / "cache"))
    monkeypatch.setenv("SLURM_CONF", "/nonexistent")
    hpc.submit(BOXED, cluster="slurm", dry_run=True, overrides=[
        f"run.root={site}/runs", "cluster.container.runtime=pyxis", f"cluster.container.image={site}/images/torch.sqsh"])
    (line,) = srun_lines(capsys.readouterr().out)
    mounts = next(w for w in shlex.split(line) if w.startswith("--container-mounts=")).partition("=")[2]
    sources = [m.split(":") for m in mounts.split(",")]
    assert all(len(parts) == 2 and parts[0] == parts[1] for parts in sources), mounts
    assert re.fullmatch(rf"{re.escape(str(site))}/runs/boxed-\d{{8}}-\d{{6}}", sources[0][0]), mounts


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_a_relative_image_file_is_named_by_its_absolute_path(site, runtime, monkeypatch, capsys):
    """Pyxis reads an image that starts with neither '/' nor '.' as a registry name, and a task's
    directory is not the submission's: the srun line names the file the submission found."""
    from hpc import submit

    monkeypatch.chdir(site / "images")
    monkeypatch.setenv("HPC_CACHE_DIR", str(site / "cache"))
    name = "torch.sqsh" if runtime == "pyxis" else "torch.sif"
    assert submit.main(["langsplat", "--dry-run", "--run-dir", "/RUN", "--cluster", "slurm", "--profile", "sandbox",
                        f"cluster.container.runtime={runtime}", f"cluster.container.image={name}"]) == 0
    lines = srun_lines(capsys.readouterr().out)
    assert len(lines) == 2
    for words in map(shlex.split, lines):
        image = f"--container-image={site}/images/{name}" if runtime == "pyxis" else f"{site}/images/{name}"
        assert image in words and name not in words and f"--container-image={name}" not in words


def test_apptainer_env_is_set_over_the_images_own(site):
    """Apptainer lets a host variable through only where the image sets none; APPTAINERENV_<NAME>
    (like --env) is set over the image's value, so the batch script exports that."""
    out = dry_run(site, "cluster.container.runtime=apptainer", f"cluster.container.image={site}/images/torch.sif",
                  "cluster.container.env={NCCL_DEBUG: INFO, TAG: a b}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("export APPTAINERENV_NCCL_DEBUG=INFO\n") == 2
    assert out.stdout.count("export APPTAINERENV_TAG='a b'\n") == 2
    assert "export NCCL_DEBUG" not in out.stdout
