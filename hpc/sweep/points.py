"""A sweep's point configs: the base config with each point's overrides, its stages, its config.yaml.

    python -m hpc.submit tiny --sweep tiny.score=1,2 --dry-run      # hpc.sweep.submission calls these

A fresh load (templates, profile, merges) per point would cost far more than the submission itself:
one copy of the base config is updated point after point instead (every point sets every swept
key), and a point's config.yaml reuses the base's text for every top-level section the grid does
not touch, which is exact unless some value is an interpolation (then each is written whole).
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Iterator, Sequence, Tuple

from hpc.config import schema as hconfig
from hpc.pipeline import plan as hplan
from hpc.sweep import grid as hgrid

Defs = Dict[str, Dict[str, hplan.StageDef]]  # signature -> stage name -> that point's StageDef


def configs(base: Any, points: Sequence[hgrid.Point], settle: Any = None) -> Iterator[Tuple[hgrid.Point, Any]]:
    """(point, its config) in turn: the base with the point's overrides, type-checked. One copy of
    the base is updated point after point (each sets every swept key): a copy or a fresh load per
    point costs far more. Each config is valid until the next point is yielded."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = copy.deepcopy(base)
    for point in points:
        for key, value in point.overrides.items():
            try:  # a mapping merges into the base's, as a key=value override would
                value = OmegaConf.merge(OmegaConf.select(base, key), value) if isinstance(value, dict) else value
                OmegaConf.update(cfg, key, value, merge=False)
            except OmegaConfBaseException as err:
                detail = str(getattr(err, "msg", err)).splitlines()[0]
                raise hgrid.SweepError(f"--sweep {key}={value!r}: {detail}; expected a value of the key's type. "
                                       f"HINT: see the pipeline's config dataclass for {key}.") from None
        if settle is not None:  # a swept value may be one another's default depends on
            settle(cfg)
        yield point, cfg


def resolve(base: Any, points: Sequence[hgrid.Point], pipe: hplan.PipelineDef) -> Defs:
    """Each point's stages, after the pipeline's own checks of its config."""
    defs = {}
    for point, cfg in configs(base, points, pipe.settle):
        pipe.validate(cfg)
        defs[point.signature] = {s.name: s for s in pipe.stages(cfg)}
    return defs


def texts(base: Any, points: Sequence[hgrid.Point], settle: Any = None) -> Dict[str, str]:
    """Each point's config.yaml text, as hpc.config.schema.to_yaml writes its config."""
    from omegaconf import OmegaConf

    if _interpolated(OmegaConf.to_container(base, resolve=False)):  # a swept value may show elsewhere
        return {point.signature: hconfig.to_yaml(cfg) for point, cfg in configs(base, points, settle)}
    sections = {key: hconfig.to_yaml(OmegaConf.masked_copy(base, [key])) for key in base}  # the YAML of
    out = {}  # a mapping is the YAML of its top-level keys one after another
    for point, cfg in configs(base, points, settle):
        swept = {key.split(".")[0] for key in point.overrides}
        out[point.signature] = "".join(hconfig.to_yaml(OmegaConf.masked_copy(cfg, [key])) if key in swept
                                       else text for key, text in sections.items())
    return out


def _interpolated(tree: Any) -> bool:
    """Whether a plain config tree holds an interpolation (${...}) anywhere."""
    if isinstance(tree, dict):
        return any(_interpolated(v) for v in tree.values())
    if isinstance(tree, list):
        return any(_interpolated(v) for v in tree)
    return isinstance(tree, str) and "${" in tree
