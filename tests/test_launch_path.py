"""One launch path: a stage's tasks are started from hpc.pipeline.launcher.launch() alone.

    python -m pytest tests/test_launch_path.py

A run, a sweep and `--cluster here` go through launch(), which has a Backend start each job
(Backend.start_job): submitit's sbatch (hpc.pipeline.executor.submit_array) or an srun step of the
allocation (start_step). Every call is read from the source (ast): each way of starting a task is
called from one function only, and the chain of those functions ends in launch(), so a fix made on
that path reaches batch submission, sweeps and `here` at once.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

from tests.test_layers import ROOT, modules

LAUNCH = ("hpc.pipeline.launcher", "launch")
# name called -> the functions (module, qualified name) that alone may call it
CALLERS: Dict[str, Set[Tuple[str, str]]] = {
    "start_job": {LAUNCH},
    "submit_array": {("hpc.pipeline.launcher", "Submitit.start_job")},
    "start_step": {("hpc.here.backend", "Here.start_job")},
}
# submitit's own submission (executor.submit, its _submit_command): inside submit_array, and in the
# srun wrapper's helper job that resubmits a run (through the launch path: hpc.afterstep.resubmit)
SUBMITIT = {("hpc.pipeline.executor", "submit_array"), ("hpc.afterstep", "resubmit_after")}
STEP_PACKAGES = ("hpc.pipeline", "hpc.sweep", "hpc.here")  # where a Popen would start a stage's step
STEP = {("hpc.here.steps", "start_step"),  # srun of one task's step
        ("hpc.pipeline.packrun", "drive.start")}  # inside a packed job launch() submitted: each item's step


def calls(path: Path) -> Iterator[Tuple[str, str, str]]:
    """(called name, its receiver's name or '', the qualified name of the function it is in)."""

    def walk(node: ast.AST, where: str) -> Iterator[Tuple[str, str, str]]:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Call):
                func = child.func
                if isinstance(func, ast.Name):
                    yield func.id, "", where
                elif isinstance(func, ast.Attribute):
                    yield func.attr, func.value.id if isinstance(func.value, ast.Name) else "", where
            yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text()), "")


def offences(root: Path = ROOT) -> list:
    bad = []
    for module, path in modules(root).items():
        for name, receiver, where in calls(path):
            here = (module, where)
            if name in CALLERS and here not in CALLERS[name]:
                bad.append(f"{module}:{where} calls {name}")
            if name in ("submit", "_submit_command") and receiver in ("executor", "array") and here not in SUBMITIT:
                bad.append(f"{module}:{where} calls {receiver}.{name}")
            if name == "Popen" and module.startswith(STEP_PACKAGES) and here not in STEP:
                bad.append(f"{module}:{where} calls Popen")
    return bad


def test_only_the_launch_function_starts_a_stage_s_tasks() -> None:
    assert offences() == []


def test_every_way_of_starting_a_task_is_reached_from_launch() -> None:
    """The chain is whole: each function allowed to start tasks is itself called, and only as CALLERS says."""
    found: Dict[str, Set[Tuple[str, str]]] = {name: set() for name in CALLERS}
    for module, path in modules().items():
        for name, _, where in calls(path):
            if name in found:
                found[name].add((module, where))
    assert found == CALLERS


def test_the_check_sees_a_second_launch_loop(tmp_path: Path) -> None:
    """The check itself: a scratch tree whose sweep submits an array of its own fails it."""
    for name, text in {"hpc/__init__.py": "", "hpc/sweep/__init__.py": "",
                       "hpc/sweep/launch.py": "def mine(executor, tasks):\n    submit_array(executor, tasks)\n"
                                              "    executor.submit(tasks[0])\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert offences(tmp_path) == ["hpc.sweep.launch:mine calls submit_array", "hpc.sweep.launch:mine calls executor.submit"]
