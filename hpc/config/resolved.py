"""A saved config.yaml read back as plain data without OmegaConf, as every task reads its run's config.

    python -c "from hpc.config.resolved import read; print(read('runs/x/config.yaml')['run'])"

hpc.submit writes config.yaml resolved (hpc.config.schema.to_yaml, OmegaConf's dumper), so a YAML
parser reads it back whole; OmegaConf's import alone costs a task more than the rest of hpc's start-up.
The parser resolves plain scalars as OmegaConf's loader does (its wider float syntax, no timestamps:
the dumper quotes only what that loader would not read as a string), which tests/test_task_startup.py
checks against OmegaConf itself. A text with an interpolation left in it (${...}) goes through OmegaConf.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict

FLOAT = "tag:yaml.org,2002:float"
TIMESTAMP = "tag:yaml.org,2002:timestamp"
# OmegaConf's float syntax (omegaconf/_yaml.py): 1e3 and 1_000.5 are floats there, strings to YAML 1.1
OMEGACONF_FLOAT = re.compile(r"""^(?:
     [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
_LOADER: Any = None


def loader() -> Any:
    """A safe YAML loader whose implicit resolvers are OmegaConf's: the safe ones, no timestamps,
    OmegaConf's float after them."""
    global _LOADER
    if _LOADER is None:
        import yaml

        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        _LOADER = type("ResolvedConfigLoader", (base,), {"yaml_implicit_resolvers": {
            first: [(tag, rx) for tag, rx in rules if tag != TIMESTAMP]
            for first, rules in base.yaml_implicit_resolvers.items()}})
        _LOADER.add_implicit_resolver(FLOAT, OMEGACONF_FLOAT, list("-+0123456789."))
    return _LOADER


def read(path: str | Path) -> Dict[str, Any]:
    """config.yaml as plain data (dicts, lists, scalars), as OmegaConf.to_container(load(path), resolve=True)."""
    text = Path(path).read_text()
    if "${" in text:  # an interpolation hpc.submit did not resolve (a config written by hand)
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    import yaml

    data = yaml.load(text, Loader=loader())
    return data if isinstance(data, dict) else {}
