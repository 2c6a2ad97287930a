"""Every `python -m hpc.submit ...` command the docs show runs: each is dry-run, in this process.

    python -m pytest tests/test_doc_commands.py -n 0

A command is a line of README.md, docs/*.md or jobs/langsplat/README.md that starts with
`python -m hpc.submit` (after an optional `$ ` prompt or a `... && `), joined over `\\` line ends.
It runs as written plus `--dry-run` (before `--`), in a fresh directory that holds the README's
`mypkg/pipeline.py` example, so `mypkg.pipeline` is the README's own code, and with docs/remote.md's
clusters.yaml as the named clusters (a dry run to one shows its ssh commands and does not connect). With no SLURM here,
`--cluster auto` plans for the local executor and a profile's `cluster.kind: slurm` plans the sbatch
scripts without calling sbatch: what a dry run does on a login node.

A block that cannot run here is marked in the doc, on the line before it, with
`<!-- not-run: REASON -->`: a synopsis (placeholders, not a command), or a command that needs what
no test machine has (a LangSplat checkout and its scene, torchtitan). MAX_NOT_RUN keeps that list short.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

from hpc import submit

ROOT = Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:[^`#]*?&&\s*)?(python3? -m hpc\.submit\b.*)$")
NOT_RUN = re.compile(r"^\s*<!-- not-run: (.+?) -->\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
MAX_NOT_RUN = 12  # commands inside marked blocks, all docs together
EXAMPLE = "# mypkg/pipeline.py"  # the first line of the README's pipeline example
CLUSTERS = "# ~/.config/hpc/clusters.yaml"  # the first line of docs/remote.md's named clusters


def doc_files() -> List[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "jobs" / "langsplat" / "README.md"]


def commands(path: Path) -> Iterator[Tuple[int, str, Optional[str]]]:
    """(line number, command, the reason it is not run or None) of each hpc.submit command in `path`.
    A marker covers the code block after it: a fenced one up to its closing fence, an indented one up
    to the next line of prose."""
    lines = path.read_text(encoding="utf-8").splitlines()
    reason: Optional[str] = None
    block = ""  # "", "fenced" or "indented": the kind of marked block we are in
    i = 0
    while i < len(lines):
        line, number, closes = lines[i], i + 1, False
        marker = NOT_RUN.match(line)
        if marker:
            reason, block = marker.group(1), ""
        elif reason is not None and block == "fenced":
            closes = bool(FENCE.match(line))
        elif reason is not None and line.strip():
            if FENCE.match(line) and not block:
                block = "fenced"
            elif line.startswith("    "):
                block = "indented"
            else:  # prose: an indented block ended, or the marker had no block after it
                reason, block = None, ""
        m = COMMAND.match(line)
        if m:
            text = m.group(1)
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i].strip()
            yield number, text, reason
        if closes:
            reason, block = None, ""
        i += 1


def all_commands() -> List[Tuple[str, str, Optional[str]]]:
    return [(f"{path.relative_to(ROOT)}:{n}", text, reason)
            for path in doc_files() for n, text, reason in commands(path)]


def readme_example() -> str:
    """The README's `mypkg/pipeline.py`, as the README shows it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(EXAMPLE)
    return text[start:text.index("```", start)]


def clusters_example() -> str:
    """docs/remote.md's clusters.yaml, as it shows it: a dry run to a named cluster does not connect."""
    text = (ROOT / "docs" / "remote.md").read_text(encoding="utf-8")
    start = text.index(CLUSTERS)
    return text[start:text.index("```", start)]


def dry_run_argv(command: str) -> List[str]:
    argv = shlex.split(command, comments=True)[3:]  # python -m hpc.submit
    argv.insert(argv.index("--") if "--" in argv else len(argv), "--dry-run")
    return argv


RUN = [c for c in all_commands() if c[2] is None]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A directory to submit from, with the README's example package; the user's cache kept apart."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "pipeline.py").write_text(readme_example())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HPC_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "clusters.yaml").write_text(clusters_example())
    monkeypatch.setenv("HPC_CLUSTERS_FILE", str(tmp_path / "clusters.yaml"))
    for name in ("mypkg", "mypkg.pipeline"):
        monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    return tmp_path


@pytest.mark.parametrize("where, command", [c[:2] for c in RUN], ids=[c[0] for c in RUN])
def test_every_documented_submit_command_dry_runs(workdir, capsys, where, command):
    code = submit.main(dry_run_argv(command))
    out = capsys.readouterr()
    assert code == 0, f"{where}: {command}\n{out.err.strip()}"
    # a named cluster's dry run shows the ssh commands instead: the plan is made there (docs/remote.md)
    assert any(words in out.out for words in ("plan: pipeline", "sweep: pipeline", "would run, over one connection")), \
        out.out[:400]


def test_the_docs_show_commands_and_mark_few_as_not_run():
    found = all_commands()
    assert len(RUN) >= 20, [c[0] for c in RUN]  # the extraction still finds the docs' commands
    skipped = [f"{where} ({reason})" for where, _, reason in found if reason is not None]
    assert len(skipped) <= MAX_NOT_RUN, ("too many documented commands are not run; make them run:\n"
                                         + "\n".join(skipped))


def test_a_marker_covers_exactly_the_block_after_it(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("Intro\n\n<!-- not-run: synopsis -->\n\n    python -m hpc.submit PIPELINE [...]\n"
                   "    python -m hpc.submit run -- X\n\nProse.\n\n    python -m hpc.submit langsplat\n\n"
                   "<!-- not-run: needs data -->\n```bash\npython -m hpc.submit a \\\n    b=1\n```\n"
                   "```bash\n$ python -m hpc.submit c  # a comment\n```\n"
                   "- item:\n\n      python -m hpc.submit run -- python t.py\n")
    assert list(commands(doc)) == [
        (5, "python -m hpc.submit PIPELINE [...]", "synopsis"), (6, "python -m hpc.submit run -- X", "synopsis"),
        (10, "python -m hpc.submit langsplat", None), (14, "python -m hpc.submit a  b=1", "needs data"),
        (18, "python -m hpc.submit c  # a comment", None), (22, "python -m hpc.submit run -- python t.py", None)]
    assert dry_run_argv("python -m hpc.submit run --nodes 2 -- python t.py --x  # c") == [
        "run", "--nodes", "2", "--dry-run", "--", "python", "t.py", "--x"]
