"""python -m hpc.status SWEEP_DIR finds by its token a sweep's array whose sbatch answer and look-up were lost,
and shows it in its points: one squeue call while an announcement is pending, none once it is settled.

    python -m pytest tests/slurm/test_lost_sweep_status.py
"""
import json

import pytest

from faults.slurmshim import SlurmShim
from hpc.rundir import intents
from tests.slurm.test_flaky_controller import _hpc
from tests.slurm.test_lost_submissions import lost_sweep_array, site  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slurm


def sweep_rows(sweep, env) -> dict:
    out = _hpc("hpc.status", str(sweep), "--json", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return {r["point"]: r for r in json.loads(out.stdout)}


def test_sweep_status_shows_an_array_whose_answer_and_lookup_were_lost_in_its_points(site):  # noqa: F811
    sweep, shim, args, array, comment = lost_sweep_array(site)  # `first` of both points: one array
    asked = SlurmShim(site / "status-shim")
    rows = sweep_rows(sweep, asked.env())
    assert len(rows) == 2 and {r["state"] for r in rows.values()} <= {"PENDING", "RUNNING"}, rows
    assert all(r["tasks"] == "0/1" and r["note"].startswith(f"found by its token {comment}")
               for r in rows.values()), rows
    calls = asked.calls()  # the look-up by token, then one query for every point's jobs
    assert [c[0] for c in calls] == ["squeue", "sacct"] and "--me" in calls[0], calls
    assert array in " ".join(calls[1]), calls
    table = _hpc("hpc.status", str(sweep), env=asked.env()).stdout
    assert table.count(f"found by its token {comment}") == 2 and "NOT SUBMITTED" not in table, table

    shim.clear()
    again = _hpc("hpc.submit", *args, env=shim.env())  # adopts the array: `second` alone is queued
    assert again.returncode == 0 and intents.pending(sweep) == [], again.stdout + again.stderr
    before = len(asked.calls())
    rows = sweep_rows(sweep, asked.env())
    assert [c[0] for c in asked.calls()[before:]] == ["sacct"]  # nothing pending: no look-up
    assert all(r["tasks"] == "0/2" and r["note"].startswith(f"found by its token {comment}")
               for r in rows.values()), rows
