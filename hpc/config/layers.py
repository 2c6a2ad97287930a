"""The layers of a config: YAML files, a profile, key=value overrides, merged over the schema in order.

    python -m hpc.submit langsplat --profile sandbox stages.features.nodes=1 --dry-run

Each layer is read as YAML (a syntax error names its file and line) and merged into the config
OmegaConf built from the schema; a key the schema does not have is refused with the valid keys
around it and the closest of them. A profile sets `stages.*` for every stage at once. OmegaConf and
yaml are imported here, inside the functions: only a config that is not in the cache
(hpc.config.cache) is built.
"""
from __future__ import annotations

import re
from importlib import resources
from importlib.abc import Traversable
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence, Tuple

from hpc.config.checks import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigKeyError

PROFILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a plain file name under templates/profiles/


def templates_root() -> Traversable:
    """The shipped templates (package hpc.templates; the repository's templates/ directory)."""
    return resources.files("hpc.templates")


def read_yaml(source: Any, origin: str) -> DictConfig:
    """A YAML mapping from a file (Path or importlib Traversable); a syntax error names file and line."""
    import yaml
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        text = source.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{origin}: cannot be read ({err}); expected a UTF-8 YAML file. "
                          f"HINT: fix or remove {origin}.") from None
    try:
        data = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}" if mark is not None else origin
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}; expected valid YAML. "
                          f"HINT: fix line {mark.line + 1 if mark is not None else '?'} of {origin}.") from None
    except (AssertionError, OmegaConfBaseException):  # a bare scalar
        data = None
    if not isinstance(data, DictConfig):
        what = "a list" if isinstance(data, ListConfig) else "no mapping"
        raise ConfigError(f"{origin} holds {what}; expected a mapping of config keys (e.g. stages: ...). "
                          f"HINT: see templates/ for the layout.")
    return data


def changes(before: DictConfig, after: DictConfig) -> List[str]:
    """'key old -> new' for every leaf that differs (the plan says what a profile changed)."""
    from omegaconf import OmegaConf

    old, new = (dict(_leaves(OmegaConf.to_container(c, resolve=True))) for c in (before, after))
    return [f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v]


def _leaves(node: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def profile_names(templates: Optional[Traversable] = None) -> List[str]:
    folder = (templates or templates_root()) / "profiles"
    return sorted(p.name[:-len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def profile_path(profile: str, templates: Traversable) -> Traversable:
    names = profile_names(templates)
    if not PROFILE_NAME.fullmatch(profile):  # '', '../langsplat': a path would load other templates
        raise ConfigError(f"--profile {profile!r} is not a profile name; expected one of {names}. "
                          "HINT: name a file of templates/profiles/ without its .yaml, e.g. --profile sandbox.")
    path = templates / "profiles" / f"{profile}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown profile {profile!r}; expected one of {names}. "
                          f"HINT: add templates/profiles/{profile}.yaml or pick an existing one.")
    return path


def for_stages(profile: DictConfig, cfg: DictConfig) -> DictConfig:
    """A profile describes resources for stages of several pipelines: keep the ones this one has."""
    if "stages" in profile:
        profile.stages = {k: v for k, v in profile.stages.items() if k in cfg.stages}
    return profile


def parse_overrides(overrides: Sequence[str]) -> DictConfig:
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"cannot read override(s) {bad}; expected dotted key=value "
                          "(e.g. stages.features.nodes=2). HINT: options go before '--'.")
    from omegaconf import OmegaConf

    try:
        return OmegaConf.from_dotlist(list(overrides))
    except Exception as err:  # yaml's parser errors: the value is not valid YAML
        raise ConfigError(f"cannot parse overrides {list(overrides)}: {str(err).splitlines()[0]}. "
                          "HINT: quote lists as key=[a,b] and values with spaces as key='a b'.") from None


def merge(cfg: DictConfig, layer: Any, origin: str) -> DictConfig:
    """`layer` merged into `cfg` in place (unsafe_merge: no copy of cfg, half of a load's time);
    cfg is fresh from OmegaConf.structured in load() and nothing else holds it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    try:
        return OmegaConf.unsafe_merge(cfg, layer)
    except ConfigKeyError as err:
        raise ConfigError(_unknown_key_message(cfg, err, origin)) from None
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        if key is None:  # a value where the schema has a section: OmegaConf names no key
            raise ConfigError(_clash_message(cfg, layer, origin, str(err).splitlines()[0])) from None
        detail = str(getattr(err, "msg", err)).splitlines()[0]
        raise ConfigError(f"{origin}: bad value for {key}: {detail}. "
                          f"HINT: give {key} a value of the documented type "
                          "(see hpc/config/schema.py and the pipeline's config dataclass).") from None


def _unknown_key_message(cfg: DictConfig, err: ConfigKeyError, origin: str) -> str:
    from omegaconf import DictConfig, OmegaConf

    full_key = getattr(err, "full_key", "") or ""
    parent_path = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    parent = OmegaConf.select(cfg, parent_path) if parent_path else cfg
    valid = sorted(parent.keys()) if isinstance(parent, DictConfig) else []
    where = parent_path or "the top level"
    near = close_keys(full_key.rsplit(".", 1)[-1], valid)
    closest = f"the closest are {near}; " if near else ""
    return (f"{origin}: unknown config key {full_key!r}; valid keys under {where}: {valid}. "
            f"HINT: {closest}check the spelling, or see templates/ for the documented keys.")


def _clash_message(cfg: DictConfig, layer: Any, origin: str, detail: str) -> str:
    """Which key of `layer` gives a plain value where `cfg` has a section of keys, in one line."""
    from omegaconf import DictConfig, OmegaConf

    plain = OmegaConf.to_container(layer, resolve=False) if OmegaConf.is_config(layer) else layer
    for key, value in _leaves(plain if isinstance(plain, dict) else {}):
        node = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
        if isinstance(node, DictConfig) and not isinstance(value, dict):
            some = sorted(node.keys())
            return (f"{origin}: {key}={value!r}, but {key} is a section of keys {some}; expected a value for "
                    f"one of them. HINT: set {key}.{some[0] if some else 'KEY'}=VALUE, one key at a time.")
    return (f"{origin}: a value does not fit the config's layout ({detail}); expected the types of the "
            "pipeline's config dataclass. HINT: compare the keys you set with templates/.")


def close_keys(name: str, valid: Sequence[str]) -> List[str]:
    """The names in `valid` that a misspelt `name` most likely meant: spelt alike, or one inside the
    other ('lr' -> feature_lr, rgb_lr)."""
    import difflib  # only for a misspelt key: a submission that spells its keys right never loads it

    alike = difflib.get_close_matches(name, valid, n=5, cutoff=0.6)
    inside = [v for v in valid if name and (name in v or v in name)] if len(name) > 1 else []
    return list(dict.fromkeys(alike + inside))[:8]


def accepts(cfg: DictConfig, key: str) -> bool:
    """Whether `key=value` would be taken as an override of `cfg`: a key the config has, or a new key
    under a mapping the schema leaves open (a Dict field; a dataclass section takes only its own)."""
    from omegaconf import DictConfig, OmegaConf

    node: Any = cfg
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            return False
        if part not in node:
            return OmegaConf.get_type(node) in (dict, None) and not OmegaConf.is_struct(node)
        node = OmegaConf.select(cfg, ".".join(parts[:i + 1]), throw_on_resolution_failure=False,
                                throw_on_missing=False)
    return True
