"""The resolved-config cache (hpc.config.cache): the same inputs read back, any changed input built anew."""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
from omegaconf import OmegaConf

from hpc.config import cache as configcache
from hpc.config import schema as config
from hpc.fs import filestamp


@dataclass
class Stages:
    main: config.Resources = field(default_factory=config.Resources)


@dataclass
class Schema(config.PipelineConfig):
    stages: Stages = field(default_factory=Stages)
    lr: float = 0.1


@pytest.fixture
def templates(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "templates"
    (root / "profiles").mkdir(parents=True)
    (root / "base.yaml").write_text("lr: 0.5\n")
    (root / "profiles" / "small.yaml").write_text("stages:\n  main:\n    cpus_per_task: 3\n")
    return root


def load(templates, overrides=("stages.main.time_min=30",), view=True) -> Any:
    return config.load(Schema, "p", "small", list(overrides), None, templates=templates, extra=["base.yaml"],
                       view=view)


def builds(monkeypatch) -> Dict[str, int]:
    count = {"n": 0}
    real: Callable = OmegaConf.structured

    def counted(*args, **kwargs):
        count["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(OmegaConf, "structured", counted)
    return count


def test_the_same_inputs_read_the_config_back_and_a_changed_input_builds_it_again(templates, monkeypatch):
    count = builds(monkeypatch)
    first = load(templates)
    again = load(templates)
    assert count["n"] == 1 and config.to_yaml(again) == config.to_yaml(first)
    assert again.stages.main.cpus_per_task == 3 and again.lr == 0.5 and config.to_dict(again) == config.to_dict(first)
    with pytest.raises(TypeError, match="read-only.*HINT"):  # a submission's config cannot change
        again.stages.main.cpus_per_task = 1
    built = load(templates, view=False)  # the DictConfig, read back as well (a sweep varies it)
    assert count["n"] == 1 and OmegaConf.get_type(built) is Schema and config.to_dict(built) == config.to_dict(first)
    with pytest.raises(Exception):  # still a structured config: unknown keys are refused
        built.stages.main.bogus = 1
    (templates / "profiles" / "small.yaml").write_text("stages:\n  main:\n    cpus_per_task: 4\n")
    assert load(templates).stages.main.cpus_per_task == 4 and count["n"] == 2
    (templates / "base.yaml").write_text("lr: 0.25\n")
    assert load(templates).lr == 0.25 and count["n"] == 3
    assert load(templates, ["stages.main.time_min=31"]).stages.main.time_min == 31 and count["n"] == 4


def test_a_refused_config_is_never_kept(templates, monkeypatch):
    count = builds(monkeypatch)
    for _ in range(2):
        with pytest.raises(config.ConfigError, match="time_min"):
            load(templates, ["stages.main.time_min=0"])
    assert count["n"] == 2


def test_a_schema_default_without_stable_text_is_not_cached():
    @dataclass
    class Odd:
        thing: Any = field(default_factory=object)

    assert configcache.schema_text(Odd) is None and configcache.schema_text(Schema) is not None
    assert "lr:<class 'float'>=0.1" in configcache.schema_text(Schema)


def test_a_settle_hook_fills_in_before_the_checks_and_is_kept_only_when_pure(templates, monkeypatch):
    count = builds(monkeypatch)
    seen = []

    def pure(cfg):
        cfg.lr = cfg.stages.main.cpus_per_task / 10  # depends on the config alone
        return True

    def reads_files(cfg):
        seen.append(cfg.lr)
        return False

    for _ in range(2):
        cfg = config.load(Schema, "p", "small", [], None, templates=templates, extra=["base.yaml"], settle=pure)
        assert cfg.lr == 0.3 and "lr: 0.3" in config.to_yaml(cfg)
    assert count["n"] == 1
    for _ in range(2):
        config.load(Schema, "p", "small", [], None, templates=templates, extra=["base.yaml"], settle=reads_files)
    assert count["n"] == 3 and seen == [0.5, 0.5]  # never read back: built, and settled, each time


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's package whose settle hook calls a helper module of the same package, and a hook that
    calls another top-level package of the same tree."""
    import sys

    code = tmp_path / "code"
    for name in ("settlepkg", "otherpkg"):
        (code / name).mkdir(parents=True)
        (code / name / "__init__.py").write_text("")
    (code / "settlepkg" / "hook.py").write_text(
        "from otherpkg import rate\nfrom settlepkg import helper\n\n\n"
        "def settle(cfg):\n    cfg.lr = helper.lr()\n    return True\n\n\n"
        "def settle_elsewhere(cfg):\n    cfg.lr = rate.lr()\n    return True\n")
    (code / "settlepkg" / "helper.py").write_text("def lr():\n    return 0.25\n")
    (code / "otherpkg" / "rate.py").write_text("def lr():\n    return 0.75\n")
    monkeypatch.syspath_prepend(str(code))
    yield code
    for name in [n for n in sys.modules if n.split(".")[0] in ("settlepkg", "otherpkg")]:
        del sys.modules[name]


@pytest.mark.parametrize("racy_ns", [None, 0])  # 0: no file is racy, its ctime alone tells the edit
def test_a_changed_helper_module_of_the_settle_hook_builds_the_config_anew(templates, project, monkeypatch, racy_ns):
    import importlib
    import importlib.util
    import os

    from settlepkg import helper, hook

    if racy_ns is not None:
        monkeypatch.setattr(filestamp, "RACY_NS", racy_ns)
    count = builds(monkeypatch)
    settle = lambda: config.load(Schema, "p", "small", [], None, templates=templates,  # noqa: E731
                                 extra=["base.yaml"], settle=hook.settle)
    assert settle().lr == 0.25 and settle().lr == 0.25 and count["n"] == 1  # kept, and read back
    path = project / "settlepkg" / "helper.py"
    before = path.stat()
    path.write_text("def lr():\n    return 0.50\n")  # the same length, and the same mtime
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    # Python's bytecode cache is checked by the same mtime and size: drop it, or the reload below
    # would run the old code whatever hpc's cache decides
    Path(importlib.util.cache_from_source(str(path))).unlink(missing_ok=True)
    importlib.reload(helper)
    assert settle().lr == 0.5 and count["n"] == 2


def test_a_settle_hook_that_runs_code_of_another_package_is_never_kept(templates, project, monkeypatch):
    from settlepkg import hook

    count = builds(monkeypatch)
    for _ in range(2):
        cfg = config.load(Schema, "p", "small", [], None, templates=templates, extra=["base.yaml"],
                          settle=hook.settle_elsewhere)
        assert cfg.lr == 0.75
    assert count["n"] == 2  # otherpkg is not in the key: built each time


def test_a_settle_hook_that_breaks_the_schema_names_the_pipeline(templates):
    def bad(cfg):
        cfg.lr = "fast"

    with pytest.raises(config.ConfigError, match="pipeline 'p' could not settle.*HINT"):
        config.load(Schema, "p", "small", [], None, templates=templates, extra=["base.yaml"], settle=bad)


def files_under(root) -> list:
    import os

    return sorted(os.path.relpath(os.path.join(here, n), root) for here, dirs, names in os.walk(root)
                  for n in [*names, *dirs])


def test_a_dry_run_writes_no_file_and_reads_back_a_kept_config_without_omegaconf_or_yaml(tmp_path):
    """A dry run in a fresh home leaves no file anywhere (run dir, cache, working directory); a
    config kept by a submission is read back by the next dry run as plain data."""
    import os
    import subprocess
    import sys

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HPC_CACHE_DIR"}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    argv = ["langsplat", "--levels", "0", "1", "2", "--cluster", "local", "--run-dir", str(tmp_path / "r")]
    probe = ("import sys; from hpc import submit; code = submit.main(sys.argv[1:]); "
             "print('IMPORTED', sorted(m for m in ('omegaconf', 'yaml') if m in sys.modules)); sys.exit(code)")
    keep = ("import sys; from hpc import submit; from hpc.pipeline import submission; "
            "submission.build(submit.parse_args(sys.argv[1:]))")  # what a submission does first: keeps it

    def run(script, *extra):
        done = subprocess.run([sys.executable, "-c", script, *argv, *extra], capture_output=True, text=True,
                              env=env, cwd=cwd)
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = run(probe, "--dry-run")
    assert "IMPORTED ['omegaconf', 'yaml']" in first  # built: through OmegaConf
    assert files_under(tmp_path) == ["cwd", "home"]  # nothing written: no cache entry, no run dir
    run(keep)
    [entry] = (tmp_path / "xdg" / "hpc" / "config").iterdir()
    again = run(probe, "--dry-run")
    assert "IMPORTED []" in again  # read back as plain data
    plan = [line for line in first.splitlines() if not line.startswith("IMPORTED")]
    assert plan == [line for line in again.splitlines() if not line.startswith("IMPORTED")]
    assert files_under(tmp_path) == ["cwd", "home", "xdg", "xdg/hpc", "xdg/hpc/config", f"xdg/hpc/config/{entry.name}"]


def test_a_sweep_s_dry_run_writes_no_file(tmp_path, monkeypatch, capsys):
    from hpc import submit

    for name in ("home", "cwd"):
        (tmp_path / name).mkdir()
    monkeypatch.delenv("HPC_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path / "cwd")
    assert submit.main(["langsplat", "--cluster", "local", "--run-dir", str(tmp_path / "sweep"), "--dry-run",
                        "--sweep", "langsplat.levels=[0],[0,1]"]) == 0
    assert "2 point(s)" in capsys.readouterr().out
    assert files_under(tmp_path) == ["cwd", "home"]
