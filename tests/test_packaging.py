"""A non-editable install (a wheel, `pip install .`) carries the templates and installs only `hpc`.

    pytest tests/test_packaging.py
"""
import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # A copy of the sources: building in place would leave build/ and egg-info in the checkout.
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (build / name).parent.mkdir(parents=True, exist_ok=True)
            (build / name).write_bytes(src.read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(build)], check=True, capture_output=True)
    return next(out.glob("hpc-*.whl"))


def test_wheel_ships_templates_and_nothing_generic_at_the_top_level(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"hpc"}, tops
    for template in ("langsplat.yaml", "langsplat_external.yaml", "run.yaml", "profiles/sandbox.yaml",
                     "profiles/gpu8.yaml"):
        assert f"hpc/templates/{template}" in names
    assert "hpc/jobs/langsplat/pipeline.py" in names and "hpc/jobs/run.py" in names


def _dependency_dirs() -> list[str]:
    """Where this interpreter finds torch, submitit and omegaconf: its own site-packages, whether it
    is a virtualenv, a conda env or the system Python (a venv's `system_site_packages` would reach
    the base interpreter's instead, which a virtualenv's dependencies are not in)."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen: list[str] = []
    for d in dirs:
        if os.path.isdir(d) and d not in seen and not Path(d).resolve().is_relative_to(ROOT):
            seen.append(d)
    return seen


def test_installed_wheel_reads_its_templates_outside_the_checkout(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    str(wheel)], check=True, capture_output=True)
    # The dependencies come from the running interpreter's site-packages, appended after the new
    # environment's own: a plain path line in a .pth file is not itself scanned for .pth files, so
    # an editable install of hpc there (a finder hook in a .pth) stays invisible and the wheel's hpc
    # is the one imported.
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "test-dependencies.pth").write_text("\n".join(_dependency_dirs()) + "\n")
    probe = ("import hpc.config.schema as c, hpc.config.layers as layers, hpc.pipeline.plan as p;"
             "pipe = p.get_pipeline('langsplat');"
             "cfg = c.load(pipe.schema, 'langsplat', extra=pipe.templates);"
             "sandbox = c.load(pipe.schema, 'langsplat', 'sandbox', extra=pipe.templates);"
             "print(layers.templates_root(), cfg.stages.features.local_tasks, cfg.stages.rgb.time_min,"
             " sandbox.cluster.partitions)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    where, local_tasks, time_min, partitions = out.stdout.split(maxsplit=3)
    assert str(env_dir) in where  # the wheel's copy, not the checkout's
    assert (local_tasks, time_min) == ("2", "120")  # templates/langsplat.yaml, not dataclass defaults
    assert partitions.strip() == "['low', 'high']"  # profiles/sandbox.yaml


def test_a_missing_template_is_an_error(tmp_path):
    from hpc.config import schema as config
    from hpc.pipeline import plan

    pipe = plan.get_pipeline("langsplat")
    (tmp_path / "profiles").mkdir()
    with pytest.raises(config.ConfigError, match="langsplat.yaml .*not found.*HINT"):
        config.load(pipe.schema, "langsplat", templates=tmp_path, extra=pipe.templates)
