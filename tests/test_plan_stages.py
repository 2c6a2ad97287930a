"""make_plan with stages that wait on several stages, and stages skipped for a stated reason.
pytest tests/test_plan_stages.py"""
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from hpc.config.schema import PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef, make_plan


@dataclass
class Stages:
    a: Resources = field(default_factory=Resources)
    b: Resources = field(default_factory=Resources)
    c: Resources = field(default_factory=Resources)


@dataclass
class Cfg(PipelineConfig):
    stages: Stages = field(default_factory=Stages)


def pipe(skip_b: str = "") -> PipelineDef:
    stages = lambda cfg: [StageDef("a", "m:a"), StageDef("b", "m:b", items=(0, 1), skip=skip_b),
                          StageDef("c", "m:c", after=("a", "b"))]
    return PipelineDef("t", Cfg, stages, notes=lambda cfg: ["mode: test"])


def test_stage_after_two_stages_waits_on_both():
    plan = make_plan(pipe(), OmegaConf.structured(Cfg), "/r", "slurm")
    c = plan.jobs[-1]
    assert c.after == ("a", "b")
    assert "--dependency='afterok:<a>,afterok:<b>'" in c.sbatch_text()  # ',': all of them
    assert "note: mode: test" in plan.summary()


def test_skipped_stage_is_stated_and_not_waited_for():
    plan = make_plan(pipe("outputs exist"), OmegaConf.structured(Cfg), "/r", "slurm")
    assert [j.stage for j in plan.jobs] == ["a", "c"]
    assert plan.jobs[-1].after == ("a",)
    assert "skip b: outputs exist" in plan.summary()
