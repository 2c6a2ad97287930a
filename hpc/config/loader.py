"""A pipeline's config: its schema's defaults and its layers merged by OmegaConf, checked, kept.

    python -m hpc.submit langsplat --profile sandbox stages.features.nodes=1 --dry-run

Precedence, lowest first: dataclass defaults < the pipeline's templates (templates/<pipeline>.yaml, ...)
< the run directory's saved config.yaml (when resubmitting) < templates/profiles/<profile>.yaml
< dotted `key=value` command-line overrides. A profile named on a resubmission is applied over the
saved config (resuming with fewer GPUs is a profile away), and load() says which values it changed. Templates ship as package data (hpc.templates, from the
repository's templates/) and are read through importlib.resources, so an installed wheel has them too.
The resolved result is saved as <run_dir>/config.yaml. No torch here: dry-run and status stay fast.
The schema itself, the dataclasses a pipeline's config subclasses, is hpc.config.schema.
"""
from __future__ import annotations

from importlib.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from hpc.config import cache as configcache
from hpc.config import layers, userfile
from hpc.config import view as configview
from hpc.config.checks import ConfigError, check_resources, check_text

if TYPE_CHECKING:
    from omegaconf import DictConfig

# OmegaConf and yaml are imported where a config is built, not here: a submission whose config was
# built before reads it back as plain data (hpc.config.cache, hpc.config.view) and never needs them.

SAME_SOFTWARE = ("warn", "require")  # resume.same_software (hpc.config.schema.ResumeSettings)


def load(schema: type, pipeline: str, profile: Optional[str] = None,
         overrides: Sequence[str] = (), saved: Optional[Path] = None,
         templates: Optional[Traversable] = None, extra: Sequence[str] = (),
         notes: Optional[List[str]] = None, view: bool = True,
         settle: Optional[Callable[[Any], bool]] = None, keep: bool = True) -> Any:
    """Build the resolved config for `pipeline`, checked against `schema` (a dataclass).
    `extra`: the pipeline's template files (PipelineDef.templates), merged in order; each must exist:
    running on dataclass defaults because a template went missing would be silently wrong.
    `notes`: receives a line naming what a profile changed in a saved config. `settle`: the
    pipeline's hook that fills in values depending on others (PipelineDef.settle). A result built from
    the same inputs before is read back from the user's cache (hpc.config.cache); `keep=False` (a dry
    run) reads that cache but never writes it.
    Returns a read-only hpc.config.view.ConfigView, built or read back alike (so a cache hit behaves
    as a miss does); `view=False`: the DictConfig, for callers that vary it (hpc.sweep.points)."""
    templates = templates or layers.templates_root()
    sources = configcache.settle_sources(settle) if settle is not None else []
    user = userfile.read()  # the user's notify: (hpc.config.userfile), '' without one
    digest = _cache_key(schema, profile, overrides, saved, templates, extra, notes is not None, settle, sources, user)
    hit = configcache.get(digest, view)
    if hit is not None:
        if notes is not None:
            notes.extend(hit[1])
        return hit[0]
    said: List[str] = []
    cfg, plain, pure = _build(schema, pipeline, profile, overrides, saved, templates, extra,
                              said if notes is not None else None, settle, sources or [], user)
    kept = digest if pure and keep else None
    if view or kept:  # a DictConfig that is not kept needs no text
        text = to_yaml(cfg)
        configcache.put(kept, cfg, plain, text, said)
    if notes is not None:
        notes.extend(said)
    return configview.ConfigView(plain, yaml=text) if view else cfg


def _cache_key(schema: type, profile: Optional[str], overrides: Sequence[str], saved: Optional[Path],
               templates: Traversable, extra: Sequence[str], tells: bool,
               settle: Optional[Callable[[Any], bool]], sources: Optional[List[str]], user: str = "") -> Optional[str]:
    """hpc.config.cache's name for this load's result; None when an input cannot be read (the build
    then says why), or the settle hook's sources cannot be named."""
    try:
        texts = [(f"templates/{name}", (templates / name).read_text()) for name in extra] + [("user", user)]
        if saved is not None and saved.exists():
            texts.append((str(saved), saved.read_text()))
        if profile is not None:
            if not layers.PROFILE_NAME.fullmatch(profile):
                return None
            texts.append((f"profile {profile}", (templates / "profiles" / f"{profile}.yaml").read_text()))
    except (OSError, UnicodeDecodeError):
        return None
    if sources is None:  # a callable object, or a tree too large to hash
        return None
    hook = f"{settle.__module__}.{settle.__qualname__}" if settle is not None else ""
    try:
        return configcache.key(schema, [*texts, ("notes", str(tells)), ("settle", hook)], list(overrides), sources)
    except OSError:  # a source file went away: build, and keep nothing
        return None


def _build(schema: type, pipeline: str, profile: Optional[str], overrides: Sequence[str], saved: Optional[Path],
           templates: Traversable, extra: Sequence[str], notes: Optional[List[str]],
           settle: Optional[Callable[[Any], bool]] = None, sources: Sequence[str] = (), user: str = ""
           ) -> Tuple[DictConfig, Dict[str, Any], bool]:
    """The config, its plain data, and whether it may be kept (its settle hook read nothing but
    the config, and ran no code outside `sources`, the files the cache key hashed)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(schema)
    for name in extra:
        base = templates / name
        if not base.is_file():
            raise ConfigError(f"template {name} of pipeline {pipeline!r} not found in {templates}. "
                              "HINT: reinstall hpc (pip install .), or restore templates/" + name + ".")
        cfg = layers.merge(cfg, layers.read_yaml(base, f"templates/{name}"), f"templates/{name}")
    mine = userfile.layer(user)  # the user's notify: under the run's own (its saved config, profile, command line)
    if mine is not None and "notify" in cfg:
        cfg = layers.merge(cfg, *mine)
    if saved is not None and saved.exists():
        cfg = layers.merge(cfg, layers.read_yaml(saved, str(saved)), str(saved))
    if profile is not None:
        origin = f"templates/profiles/{profile}.yaml"
        tell = saved is not None and saved.exists() and notes is not None
        before = OmegaConf.create(to_dict(cfg)) if tell else None  # _merge changes cfg in place
        cfg = layers.merge(cfg, layers.for_stages(layers.read_yaml(layers.profile_path(profile, templates), origin), cfg), origin)
        if tell:
            notes.append(f"profile {profile} applied over the saved {saved}: "
                         f"{', '.join(layers.changes(before, cfg)) or 'nothing changed'}")
    cfg = layers.merge(cfg, layers.parse_overrides(overrides), "command line")
    pure = True
    if settle is not None:
        try:
            with configcache.outside(sources) as unhashed:
                pure = bool(settle(cfg))
            pure = pure and not unhashed
        except ConfigError:
            raise
        except Exception as err:  # OmegaConf's type check of a settled value
            raise ConfigError(f"the pipeline {pipeline!r} could not settle its config: {str(err).splitlines()[0]}. "
                              "HINT: check the values its settle hook reads.") from None
    check_resources(cfg)
    plain = to_dict(cfg)
    check_text(plain)
    same = (plain.get("resume") or {}).get("same_software", "warn")
    if same not in SAME_SOFTWARE:
        raise ConfigError(f"resume.same_software={same!r}; expected one of {list(SAME_SOFTWARE)}. HINT: "
                          "resume.same_software=require refuses a resume onto other software, warn shows it.")
    return cfg, plain, pure


def to_yaml(cfg: Any) -> str:
    """The YAML of a whole config (a DictConfig or the ConfigView load() returns)."""
    if isinstance(cfg, configview.ConfigView):
        return configview.to_yaml(cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(cfg, resolve=True)


def to_dict(node: Any) -> Any:
    """A config or a section of it as plain data (dicts, lists, scalars): a copy, resolved."""
    if isinstance(node, configview.ConfigView):
        return configview.to_dict(node)
    if isinstance(node, configview.ListView):
        return [to_dict(v) for v in node]
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node
