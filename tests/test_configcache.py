"""The resolved-config cache (hpc.configcache): the same inputs read back, any changed input built anew."""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict

import pytest
from omegaconf import OmegaConf

from hpc import config, configcache


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


def load(templates, overrides=("stages.main.time_min=30",)) -> Any:
    return config.load(Schema, "p", "small", list(overrides), None, templates=templates, extra=["base.yaml"])


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
    assert OmegaConf.get_type(again) is Schema and again.stages.main.cpus_per_task == 3 and again.lr == 0.5
    with pytest.raises(Exception):  # still a structured config: unknown keys are refused
        again.stages.main.bogus = 1
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
