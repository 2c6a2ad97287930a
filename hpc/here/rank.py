"""One task of a `--cluster here` run, in every rank of its srun step (hpc.here.steps starts it).

    srun ... python -u -m hpc.here.rank RUN/STAGE/logs/ID/ID_task.pkl

Unpickles the StageTask and calls it, as submitit's runner does in a batch job; rank 0 then writes
the outcome beside the logs, in submitit's result file and format (("success", result) or
("error", traceback)), which hpc.status reads for a task that has no scheduler record. A step that
ends with none (srun refused it, or a rank died first) gets one from hpc.here.steps, with srun's words.
"""
from __future__ import annotations

import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple

from hpc.fs import atomic

TASK_SUFFIX = "_task.pkl"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not args[0].endswith(TASK_SUFFIX):
        print(f"usage: python -m hpc.here.rank PATH/ID{TASK_SUFFIX}", file=sys.stderr)
        return 2
    path = Path(args[0])
    task = pickle.loads(path.read_bytes())
    outcome: Any
    try:
        outcome, code = ("success", task()), 0
    except BaseException:  # a stop (JobNotRequeued), an error, a SystemExit: the task did not finish
        traceback.print_exc()
        outcome, code = ("error", traceback.format_exc()), 1
    if os.environ.get("SLURM_PROCID", "0") == "0":
        write_outcome(result_path(str(path)[: -len(TASK_SUFFIX)]), outcome)
    return code


def result_path(logs: str) -> str:
    """Rank 0's result file of the step whose logs are `logs` (<folder>/<task id>), as submitit names it."""
    return f"{logs}_0_result.pkl"


def write_outcome(path: str, outcome: Tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(outcome)
    except Exception:  # a result that does not pickle: its text is what the status needs
        data = pickle.dumps((outcome[0], repr(outcome[1])))
    atomic.write_bytes(Path(path), data)


if __name__ == "__main__":
    sys.exit(main())
