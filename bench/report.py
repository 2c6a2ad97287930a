"""Results of one benchmark run and their rendering as BENCHMARKS.md.

    from bench.report import Section, render
    print(render([Section("demo", "Demo", "x <= 1 s", "python -m bench --only demo")], "python -m bench"))

A Section is either measured (a table, and one verdict per target check) or not measured, with the
reason; a benchmark never invents a number for a piece that is missing. Sections are also kept as
JSON beside the report (save/load), so that a run of some benchmarks (--only) updates those
sections and leaves the others' figures, each with its own command, date and machine load.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Dict, List, Optional, Tuple

MET, NOT_MET, NOT_MEASURED = "met", "NOT met", "not measured"
MEASURED = "measured (no numeric target)"


@dataclass
class Section:
    name: str  # the --only name
    title: str
    target: str  # the target in words
    command: str  # command that produced the figures
    headers: List[str] = field(default_factory=list)
    rows: List[List[str]] = field(default_factory=list)
    verdicts: List[Tuple[str, bool]] = field(default_factory=list)  # (check in words, met)
    notes: List[str] = field(default_factory=list)
    not_measured: Optional[str] = None  # why, when nothing could be measured
    seconds: float = 0.0  # wall time of the benchmark itself
    measured_at: str = ""  # when it ran, and the load then (see stamp)

    @property
    def outcome(self) -> str:
        if self.not_measured is not None or not (self.verdicts or self.rows):
            return NOT_MEASURED
        if not self.verdicts:
            return MEASURED
        return MET if all(ok for _, ok in self.verdicts) else NOT_MET


def machine() -> dict:
    """Cores, CPU model and memory of this machine, from /proc (Linux)."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()
    return {"cores": os.cpu_count(), "cpu": model, "mem_gib": round(mem_gib, 1),
            "python": platform.python_version(), "kernel": platform.release(),
            "load": " ".join(f"{x:.2f}" for x in load)}


def _when(started: Optional[float]) -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(started or time.time()))


def stamp(started: Optional[float], info: dict) -> str:
    return f"{_when(started)} on {info['cores']} cores of {info['cpu']}, load average at its start {info['load']}"


def save(sections: List[Section], path: Path) -> None:
    path.write_text(json.dumps([asdict(s) for s in sections], indent=1) + "\n")


def load(path: Path) -> Dict[str, Section]:
    """Sections of an earlier report by name; {} when there is none or it is unreadable."""
    try:
        raw = json.loads(path.read_text())
        known = {f.name for f in fields(Section)}
        return {d["name"]: Section(**{k: v for k, v in d.items() if k in known}) for d in raw}
    except (OSError, ValueError, TypeError, KeyError):
        return {}


def _table(headers: List[str], rows: List[List[str]]) -> List[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def render_section(i: int, s: Section) -> List[str]:
    out = [f"## {i}. {s.title}", "", f"Command: `{s.command}`  ", f"Target: {s.target}  ",
           f"Outcome: **{s.outcome}**" + (f" (benchmark took {s.seconds:.0f} s)" if s.seconds else "")
           + ("  " if s.measured_at else "")]
    out += [f"Measured: {s.measured_at}"] if s.measured_at else []
    out += [""]
    if s.not_measured is not None:
        out += [f"not measured: {s.not_measured}", ""]
    if s.rows:
        out += _table(s.headers, s.rows) + [""]
    out += [f"- {'met' if ok else 'NOT met'}: {what}" for what, ok in s.verdicts]
    out += [f"- note: {n}" for n in s.notes]
    return out + [""]


def render(sections: List[Section], command: str, started: Optional[float] = None,
           info: Optional[dict] = None, kept: Tuple[str, ...] = ()) -> str:
    """`kept`: names of sections carried over from an earlier run (not measured by `command`)."""
    info = info or machine()
    when = _when(started)
    carried = [s.title for s in sections if s.name in kept]
    out = ["# Benchmarks", "",
           f"Produced by `{command}` on {when}" + (
               f"; kept from earlier runs: {', '.join(carried)} (their own command and date are "
               "given in their sections)" if carried else "") + ".  ",
           f"Machine: {info['cores']} cores, {info['cpu']}, {info['mem_gib']} GiB RAM, Python "
           f"{info['python']}, Linux {info['kernel']}; load average at start {info['load']} "
           "(the machine is shared: every figure is compared with its baseline measured in the same run; "
           "a kept section names the processor it ran on where it was measured since that was recorded).",
           "", "| # | benchmark | target | outcome |", "|---|---|---|---|"]
    out += [f"| {i} | {s.title} | {s.target} | {s.outcome} |" for i, s in enumerate(sections, 1)]
    out.append("")
    for i, s in enumerate(sections, 1):
        out += render_section(i, s)
    return "\n".join(out).rstrip() + "\n"
