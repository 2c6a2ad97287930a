"""Pipeline configuration: documented dataclasses, layered YAML, checks before anything is submitted.

Usage::

    from hpc.config import PipelineConfig, Resources      # a pipeline's schema subclasses PipelineConfig
    from hpc.config.loader import load
    cfg = load(MyConfig, "mypkg.pipeline", profile="sandbox", overrides=["stages.train.nodes=2"])

Precedence, lowest first: the schema's defaults, the pipeline's template YAML, the user's notify:
(userfile.py), the run directory's saved config.yaml, a profile (templates/profiles/), then key=value overrides.

Parts::

    schema.py   Resources, ClusterSettings, RunSettings, PipelineConfig: the sections every config has
    loader.py   load(): the schema's defaults and the layers merged, checked, kept in the cache; to_yaml, to_dict
    layers.py   the layers: template and profile YAML, key=value overrides, merged in order; YAML errors
    checks.py   what is refused before submission: limits, node ranges, control characters (ConfigError)
    cache.py    a config built before from the same inputs, read back without OmegaConf
    view.py     a resolved config as a read-only view over plain data
    resolved.py a saved config.yaml read back without OmegaConf (each task's config)
    defaults.py the defaults code outside a config falls back to (max_timeouts, max_node_failures)
    userfile.py the user's cluster file: its place, and its notify: as a layer under every run's own

OmegaConf is imported only to build a config that is not in the cache.
"""
from typing import Any

# What a pipeline module imports; loaded on first use, so that importing a part of this package
# does not load the others.
PUBLIC = {"PipelineConfig": "schema", "Resources": "schema", "ClusterSettings": "schema", "RunSettings": "schema",
          "load": "loader", "ConfigError": "checks"}


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'hpc.config' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"hpc.config.{PUBLIC[name]}"), name)
