"""hpc.Sweep.metrics(goodput=True) asks the scheduler once for the whole sweep, not once per point.

    python -m pytest tests/test_sweep_metrics.py -q

The sweep is submitted whole with SLURM's clients as stand-ins on PATH (tests/test_sweep_scale.py's:
sbatch answers a job id); sacct and squeue here write their name to a log and know no job, so each
call the metrics make is counted.
"""
import hpc
from tests.test_sweep_scale import _sweep, fake_slurm  # noqa: F401  (the fixture)


def test_a_sweeps_goodput_costs_one_scheduler_call_for_every_point(tmp_path, fake_slurm, capsys):  # noqa: F811
    assert _sweep(tmp_path, range(4), range(2)) == 0, capsys.readouterr().err
    log = tmp_path / "calls.log"
    for name in ("sacct", "squeue"):
        (fake_slurm / name).write_text(f'#!/bin/bash\necho {name} >> "{log}"\n')
    sweep = hpc.Run.attach(tmp_path / "s")
    found = sweep.metrics(goodput=True)
    calls = log.read_text().split()
    assert len(found) == 8 and all(len(tasks) == 3 for tasks in found.values()), found
    assert all("goodput" in t for tasks in found.values() for t in tasks.values())
    # sacct's attempts of every job at once; without its answer, one more for the states
    assert len(calls) <= 2, calls
    assert sweep.metrics() == {sig: {} for sig in found} and len(log.read_text().split()) == len(calls)
