"""The LangSplat pipeline definition in synthetic mode (external mode: test_langsplat_external.py)."""
from hpc.config import schema as config
from hpc.pipeline import plan
from hpc.jobs.langsplat import pipeline as lp


def load(*overrides):
    pipe = plan.get_pipeline("langsplat")
    return config.load(pipe.schema, "langsplat", None, list(overrides), extra=pipe.templates, settle=pipe.settle)


def test_stages_rgb_then_one_features_task_per_level():
    cfg = load("langsplat.levels=[2,0]")
    rgb, features = lp.stages(cfg)
    assert (rgb.name, rgb.items, rgb.target) == ("rgb", (), "hpc.jobs.langsplat.pipeline:rgb")
    assert (features.items, features.after) == ((2, 0), ("rgb",))
