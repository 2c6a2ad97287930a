"""Drawing hpc.monitor.timeline's rows with matplotlib, an optional extra: pip install 'hpc[plot]'.

    python -m hpc.status RUN_DIR --timeline run.svg

One row per task (a sweep: per point, its tasks as lanes), time since the first submission along x.
Each attempt's bar carries the world size it got (and "new software" when it ran on other software than
the attempt before), in an SVG the id attempt-<task>-<job id>-<n>, and along its bottom a hatched strip
for each stretch that bought no kept training (start-up, redone, teardown, failures: hpc.monitor.goodput);
text stays text in an SVG (svg.fonttype none), so the picture can be searched.
"""
from __future__ import annotations

import importlib.util
from datetime import datetime
from pathlib import Path
from typing import Any, List, Sequence, Tuple

from hpc.config.checks import ConfigError  # not hpc.config.schema: hpc.status stays off the config machinery
from hpc.monitor.timeline import KINDS, LOST, Row, collect

FORMATS = (".svg", ".png")
ROW_IN = 0.35  # inches of height per lane
# (largest span in seconds, divisor, unit) for the time axis
UNITS: Sequence[Tuple[float, float, str]] = ((180, 1, "s"), (3 * 3600, 60, "min"), (float("inf"), 3600, "h"))


def check(out: str) -> None:
    """Refuse, before any work, an output that is neither .svg nor .png, and a missing matplotlib."""
    if Path(out).suffix.lower() not in FORMATS:
        raise ConfigError(f"--timeline {out}: the file name ends in {Path(out).suffix or 'nothing'}; expected "
                          f"one of {list(FORMATS)}. HINT: name the picture e.g. run.svg or run.png.")
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--timeline needs matplotlib, which is not installed; expected hpc with its plot "
                          "extra. HINT: pip install 'hpc[plot]' (or pip install matplotlib).")


def draw(rows: List[Row], out: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    segments = [s for r in rows for lane in r.lanes for s in lane.segments]
    t0 = min((s.start for s in segments), default=0.0)
    span = max((s.end for s in segments), default=t0) - t0
    div, unit = next((d, u) for limit, d, u in UNITS if span <= limit)
    lanes = sum(max(1, len(r.lanes)) for r in rows)
    with plt.rc_context({"svg.fonttype": "none", "font.size": 8}):
        fig, ax = plt.subplots(figsize=(10, 1.2 + ROW_IN * max(lanes, 1)))
        ticks, labels, y = [], [], 0.0
        for row in reversed(rows):  # the first row on top
            height = 1.0 / max(1, len(row.lanes))
            for n, lane in enumerate(reversed(row.lanes)):
                _lane(ax, lane.segments, y + n * height, height * 0.8, t0, div, span)
            ticks.append(y + 0.4)
            labels.append(row.label)
            y += 1.0
        ax.set_yticks(ticks)
        ax.set_yticklabels(labels)
        ax.set_ylim(-0.2, max(y, 1.0))
        ax.set_xlim(0, max(span / div, 1e-9) * 1.02)
        ax.set_xlabel(f"{unit} since {datetime.fromtimestamp(t0):%Y-%m-%d %H:%M:%S}" if segments else unit)
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
        present = [k for k in KINDS if any(s.kind == k for s in segments)]
        ax.legend(handles=[Patch(facecolor=KINDS[k][1], edgecolor="#555555", label=KINDS[k][0]) for k in present],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        fig.savefig(out, format=Path(out).suffix[1:].lower(), dpi=120, bbox_inches="tight")
        plt.close(fig)


def _lane(ax: Any, segments: Sequence[Any], y: float, height: float, t0: float, div: float, span: float) -> None:
    for s in segments:
        if s.kind in LOST:  # a strip along the bottom of its attempt's bar, drawn after it
            continue
        attempt = bool(s.gid)
        bars = ax.barh(y + height / 2, (s.end - s.start) / div, left=(s.start - t0) / div,
                       height=height if attempt else height * 0.5, color=KINDS[s.kind][1],
                       edgecolor="#333333" if attempt else "none", linewidth=0.6)
        if attempt:
            bars[0].set_gid(s.gid)
        if not s.label:
            continue
        inside = s.end - s.start >= 0.06 * max(span, 1e-9)  # else beside the bar, where it can be read
        x = ((s.start + s.end) / 2 if inside else s.end) - t0
        ax.text(x / div, y + height / 2, s.label if inside else f" {s.label}", ha="center" if inside else "left",
                va="center", fontsize=7,
                color="white" if inside and s.kind in ("COMPLETED", "FAILED", "RUNNING") else "black")
    for s in (s for s in segments if s.kind in LOST):  # hpc.monitor.goodput: what bought no kept training
        ax.barh(y + height * 0.12, (s.end - s.start) / div, left=(s.start - t0) / div, height=height * 0.24,
                color=KINDS[s.kind][1], edgecolor="none", hatch="////")


def write(path: str, out: str) -> int:
    """hpc.status --timeline: the picture of the run or sweep at `path`, drawn into `out` (.svg or .png)."""
    check(out)  # before any scheduler call: a wrong name or a missing matplotlib
    rows = collect(path)
    draw(rows, out, Path(path).resolve().name)
    print(f"wrote {out}: {sum(len(lane.segments) for r in rows for lane in r.lanes)} segment(s) in {len(rows)} row(s)")
    return 0
