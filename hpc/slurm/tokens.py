"""The jobs slurmctld holds, by the token hpc put in their comment: one squeue call for all of them.

    python -c "from hpc.slurm import tokens; print(tokens.parse('41|hpc:ab12' + chr(10) + '42|mine hpc:cd34'))"

Every sbatch hpc makes carries `--comment=hpc:<token>` (hpc.pipeline.submitonce), a token of its
own. `squeue -h -t all --me -o '%F|%k'` lists each of the user's jobs (an array once per task, under
its first job id, %F, as sbatch printed it) with its comment: the job that carries a token, whether
sbatch's answer reached hpc or not. -t all keeps the jobs that ended within MinJobAge; --me selects
by uid, whatever $USER says. sacct would know older jobs, but stores comments only where the site
sets AccountingStoreFlags=job_comment: squeue is asked, and a token it does not show is said to be
"not in the queue", never "not submitted".
"""
from __future__ import annotations

from typing import Dict, Optional

from hpc.slurm.cli import run

TAG = "hpc:"  # the token's prefix in the job's comment
ASK = ("squeue", "-h", "-t", "all", "--me", "-o", "%F|%k")


def parse(squeue_out: str) -> Dict[str, str]:
    """token -> job id (an array's first) of every hpc:<token> word in `squeue -o '%F|%k'` lines."""
    found: Dict[str, str] = {}
    for line in squeue_out.splitlines():
        job, sep, comment = line.strip().partition("|")
        if sep and job.strip():
            for word in comment.split():
                if word.startswith(TAG) and len(word) > len(TAG):
                    found.setdefault(word[len(TAG):], job.strip())
    return found


def find(squeue_out: str, token: str) -> Optional[str]:
    """The job id of the first line whose comment holds hpc:`token`, else None."""
    return parse(squeue_out).get(token)


def queued() -> str:
    """squeue's answer: every job of this user that slurmctld holds, with its comment (one call)."""
    return run(list(ASK))
