"""A resolved config as a read-only view over plain data: what a submission reads, without OmegaConf.

    cfg = ConfigView({"run": {"root": "runs"}, "stages": {"rgb": {"nodes": 1}}})
    cfg.run.root, cfg["stages"]["rgb"].nodes, list(cfg.stages), cfg.stages.items()

hpc.config.schema builds and checks a config through OmegaConf once per set of inputs and keeps the
result's plain data (hpc.config.cache). Importing OmegaConf and yaml costs a submission more than
everything else hpc adds to plain submitit, so a submission reads that data through this view
instead: attribute and item access, iteration, get/keys/items as on a DictConfig, lists as tuples
that compare equal to lists. Nothing can be set: the config a submission checked is the config it
submits. to_dict() gives a deep copy of the data; to_yaml() the text saved as the run's config.yaml,
rendered by OmegaConf when the config was built.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, Iterator, Optional


def wrap(value: Any, key: str) -> Any:
    """Dicts as views, lists as ListViews, scalars as they are."""
    if isinstance(value, dict):
        return ConfigView(value, key)
    if isinstance(value, list):
        return ListView(wrap(v, f"{key}[{i}]") for i, v in enumerate(value))
    return value


class ListView(tuple):
    """A config list: read-only, equal to a list or tuple with the same items."""

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, (list, tuple)) and tuple(self) == tuple(other)

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __repr__(self) -> str:  # as the list it holds: messages and command lines show it so
        return repr(list(self))

    __hash__ = tuple.__hash__


class ConfigView(Mapping):
    """A config mapping (the whole config, or a section of it) over plain data."""

    __slots__ = ("_data", "_key", "_yaml")

    def __init__(self, data: Dict[str, Any], key: str = "", yaml: Optional[str] = None) -> None:
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_yaml", yaml)

    def _sub(self, name: Any) -> str:
        return f"{self._key}.{name}" if self._key else str(name)

    def __getitem__(self, name: Any) -> Any:
        return wrap(self._data[name], self._sub(name))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # copy, pickle and friends probe for these
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config key {self._sub(name)!r} does not exist; valid keys under "
                                 f"{self._key or 'the top level'}: {sorted(map(str, self._data))}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(f"config key {self._sub(name)!r} cannot be set: a submission's config is read-only. "
                        "HINT: pass it as a key=value override on the command line.")

    __setitem__ = __setattr__

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ConfigView({self._data!r})"

    def __reduce__(self) -> Any:
        return (ConfigView, (self._data, self._key, self._yaml))


# functions, not methods: a config may have a key of any name
def to_dict(view: ConfigView) -> Dict[str, Any]:
    return _copy(view._data)


def _copy(value: Any) -> Any:
    """A deep copy of plain data (dicts, lists, scalars: all a view holds), without copy.deepcopy's
    bookkeeping for objects of any kind."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def to_yaml(view: ConfigView) -> str:
    if view._yaml is None:
        raise ValueError(f"config section {view._key!r} has no YAML of its own; only the whole config has")
    return view._yaml
