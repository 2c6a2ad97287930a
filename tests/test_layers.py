"""hpc's packages are layered, and no import runs up a layer or closes a circle.

    python -m pytest tests/test_layers.py

Every `import` and `from ... import` of an hpc module is read from the source (ast), at any depth:
an import inside a function is an import too. A module may import from its own package or from a
layer below its own, never from a package beside it in the same layer nor from one above, and the
graph of all of them, package by package and module by module, has no circle. A function-level
import of an hpc module must say why on its line or the line above (it keeps torch, OmegaConf,
matplotlib or submitit off a fast path). Adding a layer or a package means adding it to LAYERS.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
# Top to bottom. "hpc.X" of a top-level module is a command or the API; "hpc.X.__main__" is a command.
LAYERS: List[Set[str]] = [
    {"jobs"},
    {"commands"},
    {"hpc.sweep", "hpc.here", "hpc.remote"},
    {"hpc.pipeline"},
    {"hpc.monitor", "hpc.runtime", "hpc.scripts", "hpc.container"},
    {"hpc.checkpoint", "hpc.recovery", "hpc.cluster"},
    {"hpc.config"},
    {"hpc.rundir", "hpc.slurm"},
    {"hpc.fs"},
    {"hpc"},  # the root package: __version__, the names of modules that moved (hpc.MOVED), hpc.Frozen and Record
]


def modules(root: Path = ROOT) -> Dict[str, Path]:
    """Every module of hpc and jobs by dotted name (jobs ships as hpc.jobs; it is read as jobs)."""
    found = {}
    for path in sorted([*root.glob("hpc/**/*.py"), *root.glob("jobs/**/*.py")]):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def unit(module: str) -> str:
    """The layer unit a module belongs to: its package, or `commands` for hpc's top level."""
    parts = module.split(".")
    if parts[0] == "jobs":
        return "jobs"
    if parts == ["hpc"]:
        return "hpc"
    if len(parts) == 1 or len(parts) == 2 and parts[1] not in PACKAGES or parts[-1] == "__main__":
        return "commands"
    return ".".join(parts[:2])


PACKAGES = {p.split(".")[1] for layer in LAYERS for p in layer if p.startswith("hpc.")}


def layer_of(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit(module) in layer)


def imports(path: Path, module: str, known: Dict[str, Path]) -> Iterator[Tuple[str, int, bool, bool]]:
    """(imported hpc module, line, inside a function, says why) for each import in the file."""
    source = path.read_text()
    lines = source.splitlines()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def resolve(name: str) -> str:
        name = "jobs" + name[len("hpc.jobs"):] if name.startswith("hpc.jobs") else name
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    def why(node: ast.stmt) -> bool:
        """A comment on the statement, or above it or above the block of imports it is part of."""
        first = node.lineno - 1
        while first > 0 and lines[first - 1].strip().startswith(("from ", "import ")):
            first -= 1
        return any("#" in line for line in lines[max(first - 1, 0):node.end_lineno])

    def walk(node: ast.AST, nested: bool) -> Iterator[Tuple[str, int, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets: List[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known or
                           resolve(f"{base}.{a.name}") != resolve(base) else base for a in child.names]
            for target in targets:
                found = resolve(target)
                if found and found != module and found.split(".")[0] in ("hpc", "jobs"):
                    yield found, child.lineno, nested, why(child)
            yield from walk(child, inner)

    yield from walk(ast.parse(source), False)


def graph(known: Dict[str, Path]) -> Dict[str, Dict[str, Tuple[int, bool, bool]]]:
    out: Dict[str, Dict[str, Tuple[int, bool, bool]]] = {}
    for module, path in known.items():
        for target, line, nested, said in imports(path, module, known):
            out.setdefault(module, {}).setdefault(target, (line, nested, said))
    return out


def circle(edges: Dict[str, Set[str]]) -> List[str]:
    """One circle of the graph as a path a -> ... -> a, or [] when there is none."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def upward(known: Dict[str, Path], root: Path = ROOT) -> List[str]:
    bad = []
    for module, targets in graph(known).items():
        for target, (line, _, _) in targets.items():
            same = unit(module) == unit(target)
            if not same and layer_of(target) <= layer_of(module):
                bad.append(f"{known[module].relative_to(root)}:{line}: {module} imports {target} "
                           f"({unit(target)} is {'beside' if layer_of(target) == layer_of(module) else 'above'} "
                           f"{unit(module)})")
    return bad


def test_every_module_has_a_layer() -> None:
    known = modules()
    assert [m for m in known if not any(unit(m) in layer for layer in LAYERS)] == []


def test_no_import_runs_up_or_beside_a_layer() -> None:
    assert upward(modules()) == []


def test_no_circle_between_modules_or_packages() -> None:
    known = modules()
    edges = {m: set(t) for m, t in graph(known).items()}
    assert circle(edges) == []
    packages: Dict[str, Set[str]] = {}
    for module, targets in edges.items():
        packages.setdefault(unit(module), set()).update(unit(t) for t in targets if unit(t) != unit(module))
    assert circle(packages) == []


def test_a_function_level_import_of_hpc_says_why() -> None:
    known = modules()
    silent = [f"{known[m].relative_to(ROOT)}:{line}: {t}" for m, targets in graph(known).items()
              for t, (line, nested, said) in targets.items() if nested and not said]
    assert silent == []


def test_the_checks_see_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    """The checks themselves: a scratch tree with a circle and an upward import fails both."""
    for name, text in {"hpc/__init__.py": "", "hpc/fs/__init__.py": "", "hpc/slurm/__init__.py": "",
                       "hpc/fs/a.py": "from hpc.fs import b\n",
                       "hpc/fs/b.py": "def f():\n    from hpc.fs import a  # lazy\n    from hpc.slurm import c\n",
                       "hpc/slurm/c.py": ""}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    known = modules(tmp_path)
    assert circle({m: set(t) for m, t in graph(known).items()}) in (
        ["hpc.fs.a", "hpc.fs.b", "hpc.fs.a"], ["hpc.fs.b", "hpc.fs.a", "hpc.fs.b"])
    assert [u.split(": ", 1)[1] for u in upward(known, tmp_path)] == ["hpc.fs.b imports hpc.slurm.c (hpc.slurm is above hpc.fs)"]


MAX_LINES = 300  # one concept per module: past this it is two


def test_no_module_is_over_the_line_limit() -> None:
    long = {str(path.relative_to(ROOT)): n for path in modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these into modules of one concept each: {long}"
