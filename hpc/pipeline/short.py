"""A pipeline in a few lines: stages as plain functions with their resources, dependencies and items.

    import hpc

    def prepare(ctx): (ctx.stage_dir / "index.txt").write_text("0 1 2")
    def train(ctx): print("shard", ctx.item)

    PIPE = hpc.define("demo", hpc.stage(prepare, cpus_per_task=1, time_min=5),
                      hpc.stage(train, items=[0, 1, 2], after=[prepare], tasks_per_node=2))
    if __name__ == "__main__":
        hpc.submit(PIPE, cluster="slurm").wait()

define() builds an ordinary PipelineDef (hpc.pipeline.plan): its config has one `stages.<name>`
Resources section per stage, with the resources given here as defaults, so profiles and overrides
(stages.train.nodes=2) apply as to any pipeline. Jobs import each function again by its module and
name from the code snapshot, so the functions live at the top of a module; a script run as
`python demo.py` is that module under the name `demo` (its `if __name__ == "__main__"` keeps a job
from submitting again). A notebook's functions have no module file: put them in one and import it.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import keyword
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from hpc.config.checks import ConfigError
from hpc.config.schema import PipelineConfig, Resources
from hpc.pipeline.plan import PipelineDef, StageDef

RESOURCE_KEYS = tuple(f.name for f in dataclasses.fields(Resources))
PIPELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # it names the run directories (<name>-<time>)
Items = Union[Sequence[Any], Callable[[Any], Sequence[Any]]]  # the items, or cfg -> the items


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a short-form pipeline (stage() makes it)."""

    name: str
    target: str  # "module:function", as the job imports it
    items: Items = ()
    after: Tuple[str, ...] = ()
    per_item_after: str = ""
    resources: Dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)


def stage(func: Callable[[Any], Any], items: Items = (), after: Iterable[Any] = (), per_item_after: Any = None,
          name: str = "", **resources: Any) -> Stage:
    """`func(ctx)` runs in every task (ctx: hpc.pipeline.executor.StageContext); `items`: one array
    task each (or a function of the config returning them); `after`: stages (their functions or
    names) that must end successfully first; `per_item_after`: an earlier array stage whose task k
    alone task k waits for; `resources`: Resources fields (nodes, gpus_per_node, tasks_per_node,
    cpus_per_task, time_min, ...); `name`: the stage's name (default: the function's), an identifier."""
    if name and not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
        fixed = re.sub(r"\W+", "_", str(name)).strip("_") or "stage"
        fixed = "s_" * fixed[0].isdigit() + fixed + "_" * keyword.iskeyword(fixed)
        raise ConfigError(f"stage name {name!r} is not a Python identifier or is a keyword; expected letters, digits "
                          f"and '_', not first a digit (it is the config key stages.<name>). HINT: name={fixed!r}.")
    unknown = [k for k in resources if k not in RESOURCE_KEYS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], RESOURCE_KEYS, n=1)
        raise ConfigError(f"stage {name or getattr(func, '__name__', func)!r}: unknown resource {unknown[0]!r}; "
                          f"expected one of {list(RESOURCE_KEYS)}. HINT: "
                          + (f"did you mean {close[0]}?" if close else "see hpc.config.schema.Resources."))
    if not callable(items) and not isinstance(items, (list, tuple, range)):
        raise ConfigError(f"stage {func.__name__}: items={items!r}; expected a list (one task each) or a "
                          "function of the config. HINT: items=[0, 1, 2].")
    return Stage(name or func.__name__, target_of(func), items if callable(items) else tuple(items),
                 tuple(_name(a) for a in after), _name(per_item_after) if per_item_after else "", dict(resources))


def define(name: str, *stages: Stage, config: Optional[type] = None,
           validate: Callable[[Any], None] = lambda cfg: None) -> PipelineDef:
    """A PipelineDef of these stages, in this order; assign it at the top of the module that holds
    the functions (hpc.submit finds it there again, as the jobs do). `config`: a dataclass of the
    pipeline's own settings, the config section named `name` (overrides and sweeps set `name.key`,
    a task reads ctx.cfg[name][key], a callable `items` gets cfg.name). `name` names the run directories."""
    if not isinstance(name, str) or not PIPELINE_NAME.fullmatch(name):
        raise ConfigError(f"pipeline name {name!r}; expected letters, digits, '_', '.' and '-', first a letter or a "
                          "digit (it names the run directories, <run.root>/<name>-<time>). HINT: hpc.define('demo', ...).")
    seen: List[str] = []
    for s in stages:
        if not isinstance(s, Stage):
            raise ConfigError(f"pipeline {name!r}: {s!r} is not a stage; expected hpc.stage(function, ...). "
                              "HINT: wrap each function in hpc.stage().")
        missing = [a for a in (*s.after, *[s.per_item_after] * bool(s.per_item_after)) if a not in seen]
        if s.name in seen or missing:
            why = f"a second stage named {s.name!r}" if s.name in seen else f"stage {s.name} waits on {missing}"
            raise ConfigError(f"pipeline {name!r}: {why}; expected unique names, each waiting only on stages "
                              f"before it (before it: {seen}). HINT: list the stages in the order they run.")
        seen.append(s.name)
    module = stages[0].target.partition(":")[0] if stages else __name__
    fields = [(s.name, Resources, dataclasses.field(default_factory=functools.partial(Resources, **s.resources)))
              for s in stages]
    section = _dataclass(f"{_title(name)}Stages", fields, (), module)
    own = [] if config is None else [(_section_name(name, config), config, dataclasses.field(default_factory=config))]
    schema = _dataclass(f"{_title(name)}Config", [("stages", section, dataclasses.field(default_factory=section)),
                                                  *own], (PipelineConfig,), module)
    return PipelineDef(name, schema, functools.partial(_stage_defs, tuple(stages)), validate=validate)


def _section_name(name: str, config: Any) -> str:
    """The key of the pipeline's own settings: its name, which must be able to be a config key."""
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise ConfigError(f"pipeline {name!r}: config={config!r}; expected a dataclass (the class, not an "
                          "instance). HINT: @dataclasses.dataclass class Settings: lr: float = 0.1; config=Settings.")
    if not name.isidentifier() or name in ("stages", "run", "cluster"):
        raise ConfigError(f"pipeline {name!r} with config=: its settings are the config section {name!r}; expected "
                          "a Python identifier other than stages, run and cluster. HINT: hpc.define('my_pipe', ...).")
    return name


def _stage_defs(stages: Tuple[Stage, ...], cfg: Any) -> List[StageDef]:
    return [StageDef(s.name, s.target, tuple(s.items(cfg) if callable(s.items) else s.items), s.after,
                     s.per_item_after) for s in stages]


def target_of(func: Callable[..., Any]) -> str:
    """'module:function' a job can import: a top-level function of a module with a file."""
    qualname, module = getattr(func, "__qualname__", ""), getattr(func, "__module__", None)
    if not callable(func) or not qualname or "<" in qualname or "." in qualname or not module:
        raise ConfigError(f"stage function {func!r} is not a top-level function of a module; expected one a job "
                          "can import by name. HINT: define it with `def` at the top of a .py file.")
    if module == "__main__":
        module = _script_module()
    return f"{module}:{qualname}"


def _script_module() -> str:
    """The name a script run as `python demo.py` is imported by in its jobs (demo); that name is
    also given to the running script here, so that the pipeline is found without running it again."""
    main = sys.modules["__main__"]
    file = getattr(main, "__file__", None)
    stem = Path(file).stem if file else ""
    if not stem.isidentifier():
        raise ConfigError(f"stage functions defined in {file or 'a notebook or an interactive session'} cannot "
                          "be imported by the jobs; expected them in a .py module. HINT: move them to "
                          "mystages.py, `from mystages import *`, and define the pipeline there.")
    sys.modules.setdefault(stem, main)
    return stem


def _name(stage_ref: Any) -> str:
    if isinstance(stage_ref, str):
        return stage_ref
    if isinstance(stage_ref, Stage):
        return stage_ref.name
    return getattr(stage_ref, "__name__", str(stage_ref))


def _title(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.replace("-", "_").split("_") if p) or "Short"


def _dataclass(cls_name: str, fields: List[Any], bases: Tuple[type, ...], module: str) -> type:
    # the module is the user's: the config cache names a schema by module and class name
    cls = dataclasses.make_dataclass(cls_name, fields, bases=bases)
    cls.__module__ = module
    return cls
