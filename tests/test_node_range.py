"""Node ranges (stages.X.nodes=MIN-MAX): parsing, refusals, the sbatch line, the plan's batch lines."""
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.config import schema as config
from hpc.slurm import noderange
from hpc.pipeline import plan, sbatch

ROOT = Path(__file__).resolve().parent.parent
LIMITS = config.LIMITS["nodes"]


def load(*overrides, profile="sandbox"):
    pipe = plan.get_pipeline("langsplat")
    return pipe, config.load(pipe.schema, "langsplat", profile, list(overrides), extra=pipe.templates, settle=pipe.settle)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, LIMITS[1]), st.integers(0, LIMITS[1]))
def test_every_valid_range_parses_and_shows_as_sbatch_writes_it(lo, extra):
    hi = min(lo + extra, LIMITS[1])
    assert noderange.parse(f"{lo}-{hi}", "n", LIMITS) == (lo, hi)
    assert noderange.show((lo, hi)) == (str(lo) if lo == hi else f"{lo}-{hi}")
    assert noderange.parse(lo, "n", LIMITS) == (lo, lo) == noderange.parse(str(lo), "n", LIMITS)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=12), st.integers(-5, LIMITS[1] + 5),
                 st.from_regex(r"-?[0-9]{1,6}-{1,2}[0-9]{1,6}", fullmatch=True)))
def test_any_value_is_a_range_within_the_limits_or_one_line_with_a_hint(value):
    try:
        lo, hi = noderange.parse(value, "stages.s.nodes", LIMITS)
    except noderange.NodeRangeError as err:
        assert "\n" not in str(err) and str(err).startswith("stages.s.nodes=") and "HINT: " in str(err)
    else:
        assert 1 <= lo <= hi <= LIMITS[1]
        shown = noderange.show((lo, hi))  # what sbatch gets: plain ASCII that reads back the same
        assert shown.isascii() and noderange.parse(shown, "stages.s.nodes", LIMITS) == (lo, hi)


@pytest.mark.parametrize("value, expect", [
    ("4-2", "stages.features.nodes=4-2 has its minimum above its maximum; expected MIN <= MAX. "
            "HINT: set stages.features.nodes=2-4."),
    ("0-3", "stages.features.nodes=0-3 asks for fewer than 1 node(s); expected 1 to 10000. "
            "HINT: set stages.features.nodes=1-3."),
    ("a-b", "stages.features.nodes='a-b' is neither a node count nor a range; expected an integer or MIN-MAX "
            "(e.g. 2-4). HINT: set stages.features.nodes=2 or stages.features.nodes=2-4."),
    ("2-", None), ("-2", None), ("1-2-3", None), ("1.5", None), ("true", None), (" 1 - 2", None), ("\u0663", None),
    ("1-10001", "stages.features.nodes=1-10001 is above hpc's limit of 10000 nodes"),
    ("0", "stages.features.nodes=0 asks for fewer than 1 node(s)"),
])
def test_bad_node_ranges_are_refused_in_one_line_with_a_hint(value, expect):
    with pytest.raises(config.ConfigError) as err:
        load(f"stages.features.nodes={value}")
    text = str(err.value)
    assert "\n" not in text and "HINT:" in text and "stages.features.nodes" in text
    if expect:
        assert text.startswith(expect)


def dry_run(pipeline, *args):
    return subprocess.run([sys.executable, "-m", "hpc.submit", pipeline, "--dry-run", "--run-dir", "/RUN",
                           "--cluster", "slurm", "--profile", "sandbox", *args],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "SLURM_CONF": "/nonexistent"})


def test_a_bad_range_on_the_command_line_is_one_error_line():
    out = dry_run("langsplat", "stages.features.nodes=4-2")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "error: stages.features.nodes=4-2 has its minimum above its maximum; expected MIN <= MAX. "
        "HINT: set stages.features.nodes=2-4."]


def nodes_lines(res):
    params = sbatch.slurm_parameters(res, "features")
    return params, [line for line in sbatch.render(params, "/RUN/logs/%j").splitlines() if "--nodes" in line]


def test_a_range_renders_one_sbatch_nodes_line_and_submitit_counts_the_fewest_tasks():
    _, cfg = load("stages.features.nodes=2-4")
    res = config.to_dict(cfg)["stages"]["features"]
    params, lines = nodes_lines(res)
    assert lines == ["#SBATCH --nodes=2-4"]
    assert params["nodes"] == 2  # submitit's task count: 2 nodes x tasks_per_node
    _, cfg = load("stages.features.nodes=3")
    params, lines = nodes_lines(config.to_dict(cfg)["stages"]["features"])
    assert lines == ["#SBATCH --nodes=3"] and "nodes" not in params["additional_parameters"]


def test_the_plan_shows_the_range_and_the_batch_plan_at_each_end():
    pipe, cfg = load("stages.features.nodes=1-2", "langsplat.trainer.cameras_per_step=4",
                     "langsplat.trainer.per_device_cameras=1")
    text = plan.make_plan(pipe, cfg, "/RUN", "slurm").summary()
    assert "stage features: items [0, 1, 2] 1-2 node(s) x 2 task(s) = 2-4 rank(s) per job" in text
    assert ("    batch at 2 rank(s): global 4 = 1 per micro-batch x 2 accumulation step(s) x 2 rank(s)\n"
            "    batch at 4 rank(s): global 4 = 1 per micro-batch x 1 accumulation step(s) x 4 rank(s)") in text


def test_a_range_whose_end_the_global_batch_cannot_split_over_is_refused():
    pipe, cfg = load("stages.features.nodes=1-3", "stages.features.tasks_per_node=1",
                     "langsplat.trainer.cameras_per_step=4")
    with pytest.raises(config.ConfigError) as err:
        plan.make_plan(pipe, cfg, "/RUN", "slurm")
    assert str(err.value) == (
        "stages.features.nodes=1-3 x 1 task(s) may run on 3 node(s) = 3 rank(s), and the global batch 4 does not "
        "split over 3; expected a batch every world size of the request splits over. HINT: set "
        "stages.features.nodes=1-2 or use a global batch of 6 (a multiple of every world size in 1-3).")


def test_a_node_count_inside_the_range_is_checked_not_only_the_ends():
    # 2 and 4 nodes x 8 tasks (16, 32 ranks) split 64, but SLURM may grant 3 nodes (24 ranks)
    pipe, cfg = load("stages.features.nodes=2-4", "stages.features.tasks_per_node=8",
                     "langsplat.trainer.cameras_per_step=64")
    with pytest.raises(config.ConfigError, match=r"may run on 3 node\(s\) = 24 rank\(s\).*HINT: set "
                                                 r"stages.features.nodes=4 or use a global batch of 96 "):
        plan.make_plan(pipe, cfg, "/RUN", "slurm")
    out = dry_run("langsplat", "stages.features.nodes=2-4", "stages.features.tasks_per_node=8",
                  "langsplat.trainer.cameras_per_step=64")
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith("error: stages.features.nodes=2-4 x 8 task(s) may run on 3 node(s)")


def hinted(message, where):
    """The node counts and the global batch the HINT names (its fixes)."""
    hint = message.split("HINT: ", 1)[1]
    nodes = [noderange.parse(v, where, LIMITS) for v in re.findall(re.escape(where) + r"=([0-9-]+)", hint)]
    batch = [int(v) for v in re.findall(r"global batch of ([0-9]+)", hint)]
    return nodes, batch


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 60), st.integers(0, 12), st.integers(1, 16), st.integers(1, 5000))
def test_every_node_count_in_a_range_is_checked_and_the_hint_fixes_it(lo, extra, tasks, batch):
    hi = lo + extra
    even = all(batch % (n * tasks) == 0 for n in range(lo, hi + 1))  # the oracle: every count SLURM may grant
    try:
        noderange.check_batch("stages.s.nodes", (lo, hi), tasks, batch)
    except noderange.NodeRangeError as err:
        text = str(err)
        assert not even and "\n" not in text and text.startswith(f"stages.s.nodes={noderange.show((lo, hi))} x ")
        nodes, batches = hinted(text, "stages.s.nodes")
        assert nodes or batches
        for fix in nodes:  # a node count or range named alone splits this batch at every count
            if f"stages.s.nodes={noderange.show(fix)} with" not in text:
                noderange.check_batch("stages.s.nodes", fix, tasks, batch)
        both = re.search(r"stages.s.nodes=([0-9]+) with a global batch of ([0-9]+)", text)
        if both:  # a node count with a batch: the pair splits
            noderange.check_batch("stages.s.nodes", (int(both[1]),) * 2, tasks, int(both[2]))
        for fixed in batches[:1] if not both else []:  # a batch named alone splits over the whole request
            noderange.check_batch("stages.s.nodes", (lo, hi), tasks, fixed)
    else:
        assert even


@pytest.mark.parametrize("batch", [1, 7, 2 ** 61, 720720 * 9, 10 ** 18, math.lcm(*range(1, 41))])
def test_a_range_up_to_the_node_limit_is_checked_fast(batch):
    start = time.perf_counter()
    for tasks in (1, 8):
        try:
            noderange.check_batch("stages.s.nodes", (1, LIMITS[1]), tasks, batch)
        except noderange.NodeRangeError as err:
            assert "HINT: " in str(err)
        assert noderange.first_uneven(batch, tasks, (1, LIMITS[1])) is not None
    assert time.perf_counter() - start < 5.0  # milliseconds: the bound only catches a search over the batch's divisors


def test_the_local_executor_runs_its_own_process_count_and_names_the_range():
    pipe, cfg = load("stages.features.nodes=1-2", "stages.features.local_tasks=2", profile=None)
    p = plan.make_plan(pipe, cfg, "/RUN", "local")
    assert p.jobs[1].ranks == 2 and p.jobs[1].worlds == (2,)
    assert any("requested 1-2 node(s) x 8 task(s) = 8-16 rank(s); the local executor runs 2" in n for n in p.notes)


def test_the_run_pipeline_takes_a_node_range_on_its_command_line():
    out = dry_run("run", "--nodes", "1-2", "--", "python", "train.py")
    assert out.returncode == 0, out.stderr
    assert "stage main: 1-2 node(s) x 1 task(s) = 1-2 rank(s) per job" in out.stdout
    assert [line for line in out.stdout.splitlines() if "--nodes" in line] == ["#SBATCH --nodes=1-2"]
