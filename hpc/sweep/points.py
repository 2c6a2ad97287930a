"""A sweep's point configs: the base config with each point's overrides, its stages, its config.yaml.

    python -m hpc.submit tiny --sweep tiny.score=1,2 --dry-run      # hpc.sweep.submission calls these

A fresh load (templates, profile, merges) per point would cost far more than the submission itself:
one copy of the base config is updated point after point instead (every point sets every swept
key), and a point's config.yaml reuses the base's text for every top-level section the grid does
not touch, which is exact unless some value is an interpolation (then each is written whole).
"""
from __future__ import annotations

import copy
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hpc.config import schema as hconfig
from hpc.config import view as configview
from hpc.pipeline import plan as hplan
from hpc.sweep import grid as hgrid

Defs = Dict[str, Dict[str, hplan.StageDef]]  # signature -> stage name -> that point's StageDef


def configs(base: Any, points: Sequence[hgrid.Point], settle: Any = None) -> Iterator[Tuple[hgrid.Point, Any]]:
    """(point, its config) in turn: the base with the point's overrides, type-checked. One copy of
    the base is updated point after point (each sets every swept key): a copy or a fresh load per
    point costs far more. Each config is valid until the next point is yielded."""
    cfg = copy.deepcopy(base)
    for point in points:
        for key, value in point.overrides.items():
            _update(cfg, base, key, value)
        if settle is not None:  # a swept value may be one another's default depends on
            settle(cfg)
        yield point, cfg


def _update(cfg: Any, base: Any, key: str, value: Any) -> None:
    """Set `key` of `cfg` to `value` as a key=value override would (a mapping merges into the
    base's); a value of the wrong type is a SweepError."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        value = OmegaConf.merge(OmegaConf.select(base, key), value) if isinstance(value, dict) else value
        OmegaConf.update(cfg, key, value, merge=False)
    except OmegaConfBaseException as err:
        detail = str(getattr(err, "msg", err)).splitlines()[0]
        raise hgrid.SweepError(f"--sweep {key}={value!r}: {detail}; expected a value of the key's type. "
                               f"HINT: see the pipeline's config dataclass for {key}.") from None


def resolve(base: Any, points: Sequence[hgrid.Point], pipe: hplan.PipelineDef) -> Defs:
    """Each point's stages, after the pipeline's own checks of its config: given a read-only view
    (hpc.config.view, as a run's submission gives them) where views() can make one, else a DictConfig."""
    defs = {}
    for point, cfg in views(base, points, pipe.settle) or configs(base, points, pipe.settle):
        pipe.validate(cfg)
        defs[point.signature] = {s.name: s for s in pipe.stages(cfg)}
    return defs


def views(base: Any, points: Sequence[hgrid.Point], settle: Any = None) -> Optional[List[Tuple[hgrid.Point, Any]]]:
    """(point, its config as a read-only ConfigView) for every point, or None where that cannot be
    exact: the base's plain data shared, each point copying only the mappings on its swept keys'
    paths, and each distinct (key, value) type-checked once (OmegaConf per point costs more than the
    rest of a point's submission). Not with a settle hook (it changes a DictConfig), an
    interpolation (a swept value may show elsewhere), or one swept key inside another."""
    from omegaconf import OmegaConf

    keys = list(dict.fromkeys(k for p in points for k in p.overrides))
    if settle is not None or any(a != b and b.startswith(a + ".") for a in keys for b in keys) \
            or _interpolated(OmegaConf.to_container(base, resolve=False)):
        return None
    plain, scratch, typed = hconfig.to_dict(base), copy.deepcopy(base), {}
    out = []
    for point in points:
        data, copied = dict(plain), set()
        for key, value in point.overrides.items():
            seen = (key, repr(value))
            if seen not in typed:  # the value as the config's type makes it (1 -> 1.0 for a float)
                _update(scratch, base, key, value)
                typed[seen] = hconfig.to_dict(OmegaConf.select(scratch, key))
            *path, leaf = key.split(".")
            node = data
            for name in path:  # copy on write: the mappings above the key are this point's own
                if not isinstance(node.get(name), dict):
                    return None
                if id(node[name]) not in copied:
                    node[name] = dict(node[name])
                    copied.add(id(node[name]))
                node = node[name]
            node[leaf] = typed[seen]
        out.append((point, configview.ConfigView(data)))
    return out


def texts(base: Any, points: Sequence[hgrid.Point], settle: Any = None) -> Dict[str, str]:
    """Each point's config.yaml text, as hpc.config.schema.to_yaml writes its config."""
    from omegaconf import OmegaConf

    if _interpolated(OmegaConf.to_container(base, resolve=False)):  # a swept value may show elsewhere
        return {point.signature: hconfig.to_yaml(cfg) for point, cfg in configs(base, points, settle)}
    sections = {key: hconfig.to_yaml(OmegaConf.masked_copy(base, [key])) for key in base}  # the YAML of
    # a mapping is the YAML of its top-level keys one after another
    fast = None if settle is not None else _slotted(base, points, sections)
    if fast is not None:
        return fast
    out = {}
    for point, cfg in configs(base, points, settle):
        swept = {key.split(".")[0] for key in point.overrides}
        out[point.signature] = "".join(hconfig.to_yaml(OmegaConf.masked_copy(cfg, [key])) if key in swept
                                       else text for key, text in sections.items())
    return out


def _slotted(base: Any, points: Sequence[hgrid.Point], sections: Dict[str, str]) -> Optional[Dict[str, str]]:
    """texts() without a config per point, or None where it cannot be exact: each swept section is
    rendered once with a slot in place of each swept leaf, and each distinct (key, value) once as
    YAML. Exact for one-line scalars (numbers, booleans, null, short strings without spaces, whose
    YAML does not depend on where they stand), and only without a settle hook (which may change
    other keys); anything else takes a config per point."""
    import yaml
    from omegaconf import DictConfig, OmegaConf
    from omegaconf._utils import get_omega_conf_dumper

    def dump(tree: Any) -> str:  # as OmegaConf.to_yaml
        return yaml.dump(tree, default_flow_style=False, allow_unicode=True, sort_keys=False,
                         Dumper=get_omega_conf_dumper())

    keys = list(dict.fromkeys(k for p in points for k in p.overrides))
    slots = {key: f"hpcslot{n}x{uuid.uuid4().hex}" for n, key in enumerate(keys)}
    templates: Dict[str, str] = {}
    for top in dict.fromkeys(k.split(".")[0] for k in keys):
        node = base[top] if top in base else None
        if not isinstance(node, DictConfig):
            return None
        tree = {top: OmegaConf.to_container(node, resolve=True, enum_to_str=True)}
        if dump(tree) != sections[top]:
            return None
        for key in (k for k in keys if k.split(".")[0] == top):
            *path, leaf = key.split(".")
            node = tree
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict) or leaf not in node or isinstance(node[leaf], (dict, list)):
                return None
            node[leaf] = slots[key]
        templates[top] = dump(tree)
        if any(templates[top].count(slots[k]) != 1 for k in keys if k.split(".")[0] == top):
            return None
    scratch, typed, out = copy.deepcopy(base), {}, {}
    for point in points:
        text = dict(sections, **templates)
        for key, value in point.overrides.items():
            seen = (key, repr(value))
            if seen not in typed:  # the value as the config's type makes it (1 -> 1.0 for a float)
                OmegaConf.update(scratch, key, value, merge=False)
                typed[seen] = _scalar(OmegaConf.select(scratch, key), dump)
            if typed[seen] is None:
                return None
            top = key.split(".")[0]
            text[top] = text[top].replace(slots[key], typed[seen])
        out[point.signature] = "".join(text.values())
    return out


def _scalar(value: Any, dump: Any) -> Optional[str]:
    """The YAML of a one-line scalar that reads the same wherever it stands; None for anything else."""
    if isinstance(value, str) and not (value.isascii() and value.isprintable() and " " not in value
                                       and len(value) <= 60):
        return None
    if value is not None and not isinstance(value, (str, int, float, bool)):
        return None
    line = dump({"k": value})
    return line[3:-1] if line.startswith("k: ") and line.count("\n") == 1 else None


def _interpolated(tree: Any) -> bool:
    """Whether a plain config tree holds an interpolation (${...}) anywhere."""
    if isinstance(tree, dict):
        return any(_interpolated(v) for v in tree.values())
    if isinstance(tree, list):
        return any(_interpolated(v) for v in tree)
    return isinstance(tree, str) and "${" in tree
