"""An array's task pickles in one file; each task unpacks its own when it starts.

    PYTHON -u -m hpc.afterstep RUN_DIR --tasks <stage>/logs/tasks-<id>.bin -- srun ...   # every task's batch step

submitit writes one pickle per task at submission (<stage>/logs/J/J_k_submitted.pkl): a file
created and renamed per task, the most of a large sweep's submission. hpc.pipeline.executor.submit_array
writes one file per array instead (encode()): each task's pickle, the bytes submitit would have
written, behind an index by array task id. hpc.afterstep, in the task's batch step before srun,
copies its task's bytes to the path submitit's runner reads (unpack(): the index entry and the
pickle are all it reads, whatever the array's size). The rest stays submitit's: on the time-limit
signal checkpoint() writes the next DelayedSubmission to that path and the requeued task runs it, so
a pickle already there is never replaced (a requeue, a preemption); a job queued before these files
existed has no --tasks and reads the pickle submitit wrote for it.

Layout:
    hpc-tasks 1\\n
    PATTERN\\n                  where submitit's runner reads a task's pickle, %j for "<array job>_<task id>",
                                %A for "<array job>" (hpc.rundir.logdirs)
    SIZE records (offset, length), 16 bytes each, one per array task id 0..SIZE-1; (0, 0): no such task
    the pickles, one after another
"""
from __future__ import annotations

import os
import struct
from typing import Mapping, Tuple

MAGIC = b"hpc-tasks 1\n"
RECORD = struct.Struct("<QQ")  # offset from the start of the file, length


class TasksFileError(RuntimeError):
    """A tasks file that cannot serve this task: the message says what was seen and a HINT."""


def path_for(folder: str) -> str:
    """A new tasks file for an array whose submitit folder is `folder` ('<run>/<stage>/logs/%A'):
    beside its tasks' folders, under a name of its own."""
    return f"{folder.rsplit('/', 1)[0]}/tasks-{os.urandom(6).hex()}.bin"


def encode(pickles: Mapping[int, bytes], pattern: str) -> bytes:
    """The file holding `pickles` (array task id -> pickle bytes); `pattern` is submitit's path of a
    task's pickle with %j standing for the task's job id, %A for its array's."""
    assert pickles and "\n" not in pattern and min(pickles) >= 0, (sorted(pickles)[:3], pattern)
    head = MAGIC + pattern.encode() + b"\n"
    size = max(pickles) + 1
    index = bytearray(size * RECORD.size)
    offset = len(head) + len(index)
    for task_id in sorted(pickles):
        RECORD.pack_into(index, task_id * RECORD.size, offset, len(pickles[task_id]))
        offset += len(pickles[task_id])
    return b"".join([head, bytes(index), *(pickles[t] for t in sorted(pickles))])


def read(path: str, task_id: int) -> Tuple[str, bytes]:
    """(the pattern, task `task_id`'s pickle) from the tasks file at `path`: two lines, one index
    entry and the pickle are read."""
    with open(path, "rb") as fh:
        magic, pattern = fh.readline(), fh.readline().rstrip(b"\n").decode()
        if magic != MAGIC:
            raise TasksFileError(f"{path} starts with {magic[:20]!r}; expected {MAGIC!r}, an array's tasks file "
                                 "written by python -m hpc.submit. HINT: resubmit the stage (python -m hpc.submit "
                                 "... --run-dir RUN) to write it afresh.")
        fh.seek(fh.tell() + task_id * RECORD.size)
        entry = fh.read(RECORD.size)
        offset, length = RECORD.unpack(entry) if len(entry) == RECORD.size else (0, 0)
        fh.seek(offset)
        data = fh.read(length) if length else b""
    if not length or len(data) != length:
        raise TasksFileError(f"{path} holds no task {task_id} (entry {offset}, {length}; read {len(data)} bytes); "
                             "expected every task id of its array. HINT: resubmit the stage (python -m hpc.submit "
                             "... --run-dir RUN) to write it afresh.")
    return pattern, data


def unpack(path: str, environ: Mapping[str, str]) -> str:
    """Write this array task's pickle (SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID in `environ`) where
    submitit's runner reads it, unless a pickle is there already; returns that path."""
    job, task = environ.get("SLURM_ARRAY_JOB_ID", ""), environ.get("SLURM_ARRAY_TASK_ID", "")
    if not (job.isdigit() and task.isdigit()):
        raise TasksFileError(f"--tasks {path} outside an array task (SLURM_ARRAY_JOB_ID={job!r}, "
                             f"SLURM_ARRAY_TASK_ID={task!r}); expected both set by SLURM. HINT: only an array's "
                             "batch script passes --tasks to hpc.afterstep.")
    pattern, data = read(path, int(task))
    target = pattern.replace("%j", f"{job}_{task}").replace("%A", job)  # submitit's tags (hpc.rundir.logdirs)
    if os.path.exists(target):  # written at an earlier start, or by checkpoint(): the task's latest
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # Atomic by a rename, as hpc.fs.atomic writes, but without its imports (logging, uuid, pathlib):
    # this runs in every task's batch step. Not fsynced: the tasks file, which is, holds the same bytes.
    part = f"{target}.{os.getpid()}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(part, target)
    except BaseException:
        if os.path.exists(part):
            os.unlink(part)
        raise
    return target
