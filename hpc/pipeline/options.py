"""A pipeline's own options: declared by the pipeline, taken by python -m hpc.submit and hpc.submit().

    python -m hpc.submit run --tasks-per-node 2 -- python train.py   # hpc.submit("run", tasks_per_node=2,
                                                                      #            command="python train.py")

A PipelineDef lists its Options (PipelineDef.options); the engine knows none of them. Each is a
keyword of hpc.submit() and a flag of python -m hpc.submit (its name with dashes, or `flag`), and
sets one config key: overrides() turns the values given into dotted `key=value` overrides, which go
after the user's own, in the table's order; `also` sets more keys from every value given (a GPU
count sets the task count). How the command line takes each is its `form`: one token, several, one
quoted string read as a shell reads a command line, a switch alone, or the rest of the line after
`--`. From Python a list-valued option takes a list, or one string read as the command line reads
it ("python train.py --lr 1e-3" is four words), never split into characters. A value that does not
convert is a ConfigError naming the option, the value and what it expects.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hpc import Frozen
from hpc.config.checks import ConfigError

ONE, SEVERAL, QUOTED, SWITCH, REST = "one", "several", "quoted", "switch", "rest"
LISTS = (SEVERAL, QUOTED, REST)  # forms whose value is a list
EXPECTED = {int: "an integer", float: "a number", str: "a string"}


@dataclass(repr=False, eq=False)
class Option(Frozen):
    """One option of a pipeline: `name=` in hpc.submit(), `--name-with-dashes` on the command line."""

    name: str
    key: str  # the config key it sets (dotted)
    help: str
    convert: Callable[[Any], Any] = str  # one value (each item of a list) -> what the config gets
    form: str = ONE  # ONE | SEVERAL (nargs +) | QUOTED (one shell-quoted string) | SWITCH | REST (after --)
    flag: str = ""  # default: --name-with-dashes
    switch: Any = True  # the value a SWITCH sets
    choices: Tuple[str, ...] = ()
    metavar: Optional[str] = None
    also: Optional[Callable[[Any, Mapping[str, Any]], Mapping[str, Any]]] = None  # more keys it sets

    @property
    def cli(self) -> str:
        return "--" if self.form == REST else self.flag or "--" + self.name.replace("_", "-")


def add_to(parser: Any, options: Sequence[Option]) -> None:
    """The options as argparse arguments (values kept as given: read() converts them); the rest of
    the line after `--` is named in the group's description."""
    for opt in options:
        if opt.form == REST:
            continue
        extra: Dict[str, Any] = {"action": "store_const", "const": opt.switch} if opt.form == SWITCH else {
            "nargs": "+" if opt.form == SEVERAL else None, "metavar": opt.metavar, "choices": opt.choices or None}
        parser.add_argument(opt.cli, dest=opt.name, help=opt.help, default=None, **extra)


def rest_help(options: Sequence[Option]) -> str:
    return "; ".join(f"-- {opt.metavar or 'COMMAND ...'}: {opt.help}" for opt in options if opt.form == REST)


def one_token_flags(options: Sequence[Option]) -> Tuple[str, ...]:
    """The flags that take exactly one token (its value may start with '-': --resume-args '--x')."""
    return tuple(opt.cli for opt in options if opt.form in (ONE, QUOTED))


def read(options: Sequence[Option], given: Mapping[str, Any], cli: bool = False) -> Dict[str, Any]:
    """The values of `given` (name -> value; None and empty lists are not given), converted, in the
    table's order. `cli`: the values come from the command line (errors name the flag)."""
    table = {opt.name: opt for opt in options}
    unknown = sorted(set(given) - set(table))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown}; expected one of {sorted(table) or 'none'}. "
                          "HINT: config keys go in overrides as key=value.")
    out: Dict[str, Any] = {}
    for opt in options:
        value = given.get(opt.name)
        label = opt.cli if cli else f"{opt.name}="
        value = words(value, label) if opt.form in LISTS and value is not None else value
        if value is None or value == []:
            continue
        out[opt.name] = [_one(opt, v, label) for v in value] if opt.form in LISTS else _one(opt, value, label)
    return out


def words(value: Any, label: str) -> List[Any]:
    """A list-valued option's value as a list: a string read as a shell reads a command line."""
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as err:  # an unbalanced quote
            raise ConfigError(f"{label} {value!r} cannot be read as a command line ({err}); expected balanced "
                              "quotes. HINT: close the quote, or quote it once more for your shell "
                              "(--resume-args '--name \"a b\"').") from None
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        return list(value)
    return [value]


def _one(opt: Option, value: Any, label: str) -> Any:
    if opt.form == SWITCH:
        if not isinstance(value, bool):
            raise ConfigError(f"{label} {value!r}: expected True or False. HINT: {opt.name}={opt.switch!r}")
        return value
    if isinstance(value, (list, tuple, set, dict)):
        raise ConfigError(f"{label} {value!r} is a list; expected one value. HINT: {opt.name}=<one value>")
    try:
        converted = opt.convert(value)
    except ConfigError:  # a converter's own words
        raise
    except (TypeError, ValueError) as err:
        what = EXPECTED.get(opt.convert, f"a value {opt.convert.__name__} reads ({err})")
        raise ConfigError(f"{label} {value!r}: expected {what}. HINT: {opt.help}") from None
    if opt.choices and converted not in opt.choices:
        raise ConfigError(f"{label} {value!r}: expected one of {', '.join(opt.choices)}. HINT: {opt.help}")
    return converted


def overrides(options: Sequence[Option], values: Mapping[str, Any]) -> List[str]:
    """The values (as read() returns them) as dotted overrides, JSON-quoted so that YAML reads each
    value verbatim; each option's own key, then what its `also` sets."""
    values = read(options, values)
    out: List[str] = []
    for opt in options:
        if opt.name in values:
            value = values[opt.name]
            sets = {opt.key: value, **(opt.also(value, values) if opt.also else {})}
            out += [f"{key}={json.dumps(v)}" for key, v in sets.items()]
    return out
