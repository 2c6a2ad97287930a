"""hpc's srun wrapper (python -m hpc.afterstep) and a rank's stop request it cannot read at first.

    python -m pytest tests/test_afterstep.py

A request the wrapper lists but cannot read yet (a rank on another node whose write this node does not
see whole yet) is looked at again, not taken for settled: the rank waits for the answer to it.
"""
import json
import os
import sys

from hpc import afterstep

# a rank's request as a reader on another node may see it for a while: listed, but half-written; then whole
RANK = """import os, time
path = os.environ["HPC_HOST_ACTS"]
open(path, "w").write('{"reas')
time.sleep(2.5)
open(path + ".tmp", "w").write('{"reason": "preempt"}')
os.replace(path + ".tmp", path)
time.sleep(1.5)
"""


def test_a_request_not_readable_at_first_is_settled_at_a_later_look(tmp_path):
    request = afterstep.request_path(str(tmp_path / "run"), {"SLURM_JOB_ID": "78"})
    os.makedirs(os.path.dirname(request))
    code = afterstep.supervise([sys.executable, "-c", RANK], lambda why: False, lambda: afterstep.serve(request),
                               {**os.environ, afterstep.HOST_ACTS: request})
    assert code == 0
    assert os.path.exists(request + ".done"), sorted(os.listdir(os.path.dirname(request)))
    # settled (here it cannot be carried out: no history, no SLURM), and the rank is told so
    assert "error" in json.loads(open(request + ".done").read())["outcome"] and not os.path.exists(request)


def test_the_wrappers_retry_deadline_is_the_one_slurm_calls_read():
    from hpc.slurm import retry

    assert afterstep.RETRY_ENV == retry.DEADLINE_ENV
