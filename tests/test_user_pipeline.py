"""Users' own pipelines load from a module path, without registering them in hpc.pipeline.plan."""

import pytest

from hpc.pipeline import plan
from hpc.config.schema import ConfigError


def test_module_path_loads_its_pipeline():
    pipe = plan.get_pipeline("tests.tiny_pipeline")
    assert pipe.name == "tiny"
    assert plan.get_pipeline("tests.tiny_pipeline:PIPELINE") is pipe


@pytest.mark.parametrize("name, match", [
    ("nosuch", "unknown pipeline 'nosuch'"),
    ("tests.no_such_module", "could not be loaded"),
    ("os.path", "has no attribute 'PIPELINE'"),
    ("tests.tiny_pipeline:TinyConfig", "expected a hpc.pipeline.plan.PipelineDef"),
])
def test_bad_pipeline_names_say_how_to_fix(name, match):
    with pytest.raises(ConfigError, match=match):
        plan.get_pipeline(name)
