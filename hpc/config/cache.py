"""The resolved config of a submission whose inputs were seen before, kept in the user's cache.

    python -m hpc.submit langsplat --profile sandbox --run-dir runs/a   # builds and checks the config
    python -m hpc.submit langsplat --profile sandbox --run-dir runs/b   # the same inputs: read back

hpc.config.loader.load builds the config from the schema's dataclasses and merges the template, saved,
profile and command-line layers into it through OmegaConf, then checks it. The same inputs always
give the same config, so load() keeps each result it built under a digest of everything the
result depends on: the schema (every dataclass reachable from it: field names, types and defaults),
the text of each template, of the saved config and of the profile, the overrides, and the code that
merges and checks (hpc.config.schema and loader, hpc.config.checks, hpc.slurm.noderange and OmegaConf's files).
A pipeline's settle hook may call any module of its own project: the digest covers every source
file of the package tree the hook's module belongs to (settle_sources), and a build whose hook ran
code outside that tree, the standard library and installed packages (outside()) is not kept. A
source file counts by its stat where that vouches for its content (hpc.fs.filestamp: git's rule),
by its content where it was modified within a timestamp tick: stat-ing hpc's own tree for
LangSplat's hook (about 175 files) costs a few tenths of a ms, reading and hashing it about 2 ms;
a hit saves the ~0.5 s that importing OmegaConf and building take. An entry holds the result three ways: its plain data
and its YAML text, which a submission reads through hpc.config.view without importing OmegaConf or
yaml, and the pickled DictConfig, which a sweep needs to vary it; and the notes the build made.
Only configs that passed every check are kept: a bad input is always built, and refused, anew. A
schema whose defaults have no stable text (an object printed with its address) is not cached. A dry
run reads entries but never writes one. Entries live in $HPC_CACHE_DIR/config/
(hpc.fs.usercache); the oldest go beyond MAX_ENTRIES, and one that cannot be read or
written only costs a build.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import pickle
import sys
import time
import typing
from pathlib import Path
from typing import Any, Callable, Collection, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from hpc.config.view import ConfigView
from hpc.fs.atomic import write_bytes
from hpc.fs.filestamp import stamp
from hpc.fs.usercache import cache_dir

MAX_ENTRIES = 256
# The code a built config depends on besides the schema: a change to any of them misses the cache. By
# path, not by import: the loader (hpc.config.loader) imports this module.
_HERE = Path(__file__).resolve().parent
SOURCES = (str(_HERE / "schema.py"), str(_HERE / "loader.py"), str(_HERE / "checks.py"),
           str(_HERE.parent / "slurm" / "noderange.py"))
MAX_SOURCES = 2000  # a settle hook's package tree with more source files than this is not cached


def schema_text(schema: type) -> Optional[str]:
    """Every dataclass reachable from `schema` with its fields' names, types and defaults; None when
    a default has no stable text."""
    out: List[str] = []
    seen: Set[type] = set()
    names: Dict[type, Tuple[str, ...]] = {}  # a dataclass -> its field names: the defaults repeat classes
    types: Dict[Tuple[str, str], Any] = {}  # (module, annotation text) -> the type: the texts repeat too

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
            seen.add(tp)
            hints = _hints(tp, types)
            out.append(f"{tp.__module__}.{tp.__qualname__}")
            for f in dataclasses.fields(tp):
                default: Any = "<missing>"
                if f.default is not dataclasses.MISSING:
                    default = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    default = f.default_factory()
                out.append(f"{f.name}:{hints.get(f.name, f.type)!r}={_text(default, names)}")
                walk(hints.get(f.name))
        for arg in typing.get_args(tp):
            walk(arg)

    walk(schema)
    text = "\n".join(out)
    return None if " at 0x" in text else text


def _hints(tp: type, types: Dict[Tuple[str, str], Any]) -> Dict[str, Any]:
    """typing.get_type_hints(tp) for a dataclass whose annotations are texts (`from __future__ import
    annotations`), each text evaluated once per module, in its class's module and namespace."""
    hints: Dict[str, Any] = {}
    for base in reversed(tp.__mro__):
        module = sys.modules.get(base.__module__)
        for name, value in base.__dict__.get("__annotations__", {}).items():
            if isinstance(value, str):
                if (base.__module__, value) not in types:
                    types[base.__module__, value] = eval(value, dict(vars(module)) if module else {}, dict(vars(base)))
                value = types[base.__module__, value]
            hints[name] = type(None) if value is None else value
    return hints


def _text(value: Any, names: Dict[type, Tuple[str, ...]]) -> str:
    """repr(value), a dataclass instance spelt field by field (the schema's classes have no __repr__)."""
    kind = type(value)
    if kind in names or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        if kind not in names:
            names[kind] = tuple(f.name for f in dataclasses.fields(value))
        inner = ", ".join(f"{name}={_text(getattr(value, name), names)}" for name in names[kind])
        return f"{kind.__module__}.{kind.__qualname__}({inner})"
    if isinstance(value, (list, tuple)):
        return f"{kind.__name__}[{', '.join(_text(v, names) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_text(k, names)}: {_text(v, names)}" for k, v in value.items()) + "}"
    return repr(value)


def key(schema: type, texts: Sequence[Tuple[str, Optional[str]]], overrides: Sequence[str],
        code: Sequence[str] = ()) -> Optional[str]:
    """The digest naming a load's result; `texts`: (origin, text or None) of each layer read;
    `code`: further source files the result depends on (settle_sources), hashed by content like SOURCES."""
    described = schema_text(schema)
    # an interpolation (${oc.env:...}) may resolve differently next time: always built and checked
    if described is None or any("${" in (t or "") for _, t in texts) or any("${" in o for o in overrides):
        return None
    h = hashlib.sha256(f"{described}\n".encode())
    # By stat where it vouches for the content (hpc.fs.filestamp), else by content: an edit within the
    # file system's timestamp tick keeps size and times, and such a file is racy
    now = time.time_ns()
    for file in dict.fromkeys((*SOURCES, *code)):
        seen = stamp(file, now)
        if seen is None:
            with open(file, "rb") as fh:
                seen = hashlib.sha256(fh.read()).hexdigest()
        h.update(f"{file}\0{seen}\0".encode(errors="surrogateescape"))
    # OmegaConf by its stat, found without importing it (the point of a hit is not to); pip replaces
    # the file, so its inode and ctime change with a new version whatever its size and mtime
    spec = importlib.util.find_spec("omegaconf")
    st = os.stat(spec.origin) if spec and spec.origin else None
    h.update(f"{st and (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)}\n".encode())
    for origin, text in texts:
        h.update(f"{origin}\0{len(text) if text is not None else -1}\0{text or ''}\0".encode(errors="surrogateescape"))
    h.update("\0".join(overrides).encode(errors="surrogateescape"))
    return h.hexdigest()[:32]


def settle_sources(settle: Callable[..., Any]) -> Optional[List[str]]:
    """The source files a settle hook may read code from: every .py file under each directory of its
    module's top-level package (an editable install maps a subpackage elsewhere: hpc.jobs ->
    jobs/, so every loaded subpackage's directories too), or for a module outside any package, the
    .py files beside it. None: its code cannot be named, or the tree holds over MAX_SOURCES files."""
    file = getattr(getattr(settle, "__code__", None), "co_filename", None)
    if not file or not os.path.isfile(file):
        return None
    top = getattr(settle, "__module__", None) or ""
    top = top.partition(".")[0]
    package = sys.modules.get(top)
    if package is None or not hasattr(package, "__path__"):
        here = os.path.dirname(os.path.realpath(file))
        return sorted(os.path.join(here, n) for n in os.listdir(here) if n.endswith(".py"))
    roots = {os.path.realpath(d) for name, mod in list(sys.modules.items())
             if name == top or name.startswith(top + ".") for d in getattr(mod, "__path__", None) or ()}
    found: Set[str] = set()
    for root in sorted(roots):
        if any(root.startswith(other + os.sep) for other in roots):
            continue  # walked with its parent
        for here, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            found.update(os.path.join(here, n) for n in names if n.endswith(".py"))
            if len(found) > MAX_SOURCES:
                return None
    return sorted(found)


@contextlib.contextmanager
def outside(covered: Collection[str]) -> Iterator[Set[str]]:
    """Collects, while inside, the source files of Python code that ran (in this thread) outside
    `covered`, SOURCES, the standard library and installed packages: code a key did not hash."""
    known = {os.path.realpath(f) for f in (*covered, *SOURCES, __file__)}  # this generator resumes at exit
    seen: Set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen.add(frame.f_code.co_filename)

    found: Set[str] = set()
    before = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield found
    finally:
        sys.setprofile(before)
        import sysconfig  # only once a config is built: a hit never runs this

        fixed = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                       for k in ("stdlib", "platstdlib", "purelib", "platlib")})
        found.update(f for f in seen if not f.startswith("<")  # frozen importlib, generated code
                     and (real := os.path.realpath(f)) not in known and not real.startswith(fixed))


def _path(digest: str) -> Path:
    return cache_dir() / "config" / f"{digest}.pickle"


def get(digest: Optional[str], view: bool) -> Optional[Tuple[Any, List[str]]]:
    """(config, notes) kept under `digest`, or None; the config as an hpc.config.view.ConfigView
    when `view`, else as the DictConfig that was built."""
    if digest is None:
        return None
    try:
        entry = pickle.loads(_path(digest).read_bytes())  # plain data; the DictConfig stays bytes
        if view:
            cfg = ConfigView(entry["plain"], yaml=entry["yaml"])
        else:
            cfg = pickle.loads(entry["built"])
        return cfg, list(entry["notes"])
    except Exception:  # absent, truncated, or written by another version of a class or of hpc
        return None


def put(digest: Optional[str], built: Any, plain: Any, yaml: str, notes: Sequence[str]) -> None:
    """Keep a config: `built` (the DictConfig), `plain` (its resolved data), `yaml` (its text)."""
    if digest is None:
        return
    path = _path(digest)
    try:
        entry = {"plain": plain, "yaml": yaml, "notes": list(notes),
                 "built": pickle.dumps(built, protocol=pickle.HIGHEST_PROTOCOL)}
        write_bytes(path, pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL), sync_dir=False)
        entries = list(path.parent.glob("*.pickle"))
        if len(entries) > MAX_ENTRIES:
            for old in sorted(entries, key=lambda p: p.stat().st_mtime_ns)[:len(entries) - MAX_ENTRIES]:
                old.unlink(missing_ok=True)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass
