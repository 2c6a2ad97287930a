"""A step's SIGTERM that its ranks work through (a preemption's GraceTime, submitit ignoring it) is
looked at by hpc's srun wrapper once srun has exited 0: SLURM requeues no job that ends then.

    python -m pytest tests/test_step_term.py
"""
import os
import signal
import sys

from hpc import afterstep
from hpc.recovery import hostact


def test_srun_exiting_0_after_its_ranks_sigterm_is_looked_at_and_without_one_is_not():
    for termed, expected in ((True, ["srun exited 0 after SIGTERM"]), (False, [])):
        seen = []
        assert afterstep.supervise([sys.executable, "-c", "pass"], lambda why: seen.append(why) or True,
                                   termed=lambda: termed) == 0
        assert seen == expected


def test_a_ranks_sigterm_leaves_its_mark_for_the_host_then_reaches_the_handler_before_it(tmp_path, monkeypatch):
    request = tmp_path / ".host" / "12_1-0" / "request.json"
    request.parent.mkdir(parents=True)
    monkeypatch.setenv(hostact.ENV, str(request))
    caught = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    try:
        hostact.mark_step_term()
        assert not afterstep.termed(str(request))
        os.kill(os.getpid(), signal.SIGTERM)
        assert caught == [signal.SIGTERM]
        assert afterstep.termed(str(request))
    finally:
        signal.signal(signal.SIGTERM, before)
