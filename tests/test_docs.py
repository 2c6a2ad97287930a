"""The docs stay true to the tree: links resolve, commands name real modules, the README stays an entry page.

    python -m pytest tests/test_docs.py -n 0

Checks README.md, docs/*.md and jobs/langsplat/README.md by reading files only: no hpc module is
imported (so no torch), and a `python -m hpc.X` is resolved on the file system (hpc/X.py, or
hpc/X/__main__.py for a package). Anchors follow GitHub's heading slugs.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 200
MARKERS = ("<!-- main-command -->", "<!-- test-command -->")
# installed names of the repository's top-level packages (pyproject.toml's package-dir)
PACKAGE_DIRS = {"hpc.jobs": "jobs", "hpc.templates": "templates"}

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
MODULE = re.compile(r"python3? -m (hpc(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def doc_files() -> List[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "jobs" / "langsplat" / "README.md"]


def prose_lines(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code removed."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, INLINE_CODE.sub("", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation but hyphens dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set:
    seen: Dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings
    return found


def links(path: Path) -> Iterator[Tuple[int, str]]:
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for m in LINK.finditer(line):
            yield number, m.group(1)


def link_problem(source: Path, target: str) -> str:
    """Why a link from `source` does not resolve ('' when it does); external links are not checked."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
        return ""
    file_part, _, anchor = target.partition("#")
    dest = (source.parent / file_part).resolve() if file_part else source
    if file_part.startswith("/"):
        return f"{target}: absolute link; expected a path relative to {source.relative_to(ROOT)}"
    if not dest.exists():
        return f"{target}: {dest} does not exist"
    if anchor:
        if not dest.is_file() or dest.suffix != ".md":
            return f"{target}: an anchor into {dest.name}, which is not a Markdown file"
        if anchor not in anchors(dest):
            return f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}"
    return ""


def module_paths(module: str) -> List[Path]:
    """The files that would make `python -m module` runnable from this checkout."""
    for installed, directory in PACKAGE_DIRS.items():
        if module == installed or module.startswith(installed + "."):
            rest = module[len(installed):].lstrip(".")
            parts = [directory, *rest.split(".")] if rest else [directory]
            break
    else:
        parts = module.split(".")
    base = ROOT.joinpath(*parts)
    return [base.with_suffix(".py"), base / "__main__.py"]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert path.is_file(), f"{path} is missing"
    problems = [f"{path.relative_to(ROOT)}:{n}: {why}" for n, target in links(path)
                if (why := link_problem(path, target))]
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_m_hpc_module_exists(path: Path) -> None:
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in MODULE.finditer(line):
            candidates = module_paths(m.group(1))
            if not any(p.is_file() for p in candidates):
                problems.append(f"{path.relative_to(ROOT)}:{number}: python -m {m.group(1)}: none of "
                                + ", ".join(str(p.relative_to(ROOT)) for p in candidates))
    assert not problems, "commands naming modules that do not exist:\n" + "\n".join(problems)


def test_readme_is_an_entry_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; expected at most {MAX_README_LINES}. "
        "HINT: move reference material into docs/.")


@pytest.mark.parametrize("marker", MARKERS)
def test_readme_keeps_its_command_markers(marker: str) -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines.count(marker) == 1, f"README.md must have exactly one line {marker!r}"
    at = lines.index(marker)
    fence, command, close = (lines + ["", "", ""])[at + 1:at + 4]
    # .ci/run reads the command with awk '/<!-- test-command -->/{getline; getline; print; exit}':
    # the second line after the marker, so the fence must come right after it
    assert fence == "```bash" and close == "```", (
        f"README.md after {marker!r}: {lines[at + 1:at + 4]}; expected ```bash, one command line, ```")
    assert command.startswith("python -m "), (
        f"README.md: the line .ci/run reads after {marker!r} is {command!r}; expected a command")


def test_slugs_follow_github() -> None:
    assert slug("Preemption and time limits") == "preemption-and-time-limits"
    assert slug("Installing, templates and package data") == "installing-templates-and-package-data"
    assert slug("DDP from SLURM's variables") == "ddp-from-slurms-variables"
    assert slug("Choosing `FSDP`: 2.x") == "choosing-fsdp-2x"
    assert slug("Monitoring: status, logs, timeline, cancel") == "monitoring-status-logs-timeline-cancel"
