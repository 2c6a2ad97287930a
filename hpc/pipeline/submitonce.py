"""sbatch exactly once: each submission carries a token of its own, and a lost answer is looked up by it.

    python -c "from hpc.pipeline import submitonce; print(submitonce.find_token('41|hpc:ab12', 'ab12'))"

A busy controller can queue a job and still fail to answer sbatch (`Socket timed out on send/recv
operation`): asking again would queue it twice. So every sbatch hpc makes through submitit carries
`--comment=hpc:<token>` (a fresh token per sbatch, after the job's own comment if it has one), and
runs through hpc.slurm.cli.run; only when sbatch fails in a way that may have queued the job does
cli.run call `lookup`, one `squeue -h -t all --me -o '%F|%k'`, which returns the job (an array's
first job id, %F, as sbatch printed it) carrying the token, and sbatch is asked again only when
none does. With nothing failing, no scheduler call is added.

SlurmExecutor is submitit's with the one method that runs sbatch (_submit_command) going through
hpc.slurm.cli.run: executor.submit, executor.batch() and hpc.pipeline.executor.submit_array use it.
"""
from __future__ import annotations

import secrets
from typing import Any, Callable, Dict, Optional

import submitit
from submitit.core import utils

from hpc.slurm import cli

TAG = "hpc:"  # the token's prefix in the job's comment


def find_token(squeue_out: str, token: str) -> Optional[str]:
    """The job id of the first `squeue -o '%F|%k'` line whose comment holds hpc:`token`, else None."""
    want = TAG + token
    for line in squeue_out.splitlines():
        job, sep, comment = line.strip().partition("|")
        if sep and job.strip() and want in comment.split():
            return job.strip()
    return None


def lookup(token: str) -> Callable[[], Optional[str]]:
    """cli.run's `lookup` for an sbatch carrying `token`: sbatch's lost answer when the job is queued."""
    def queued() -> Optional[str]:
        # -t all: a job that already ended is still in slurmctld's memory for MinJobAge
        out = cli.run(["squeue", "-h", "-t", "all", "--me", "-o", "%F|%k"])  # --me: by uid, whatever $USER says
        found = find_token(out, token)
        return None if found is None else f"Submitted batch job {found}\n"
    return queued


def with_token(parameters: Dict[str, Any], token: str) -> Dict[str, Any]:
    """submitit's parameters with hpc:`token` added to the job's comment. A stage's own comment may be
    a parameter or an sbatch option of its `extra` (additional_parameters, which submitit writes last,
    so it would win): both are kept, in one --comment among the additional ones."""
    extra = dict(parameters.get("additional_parameters") or {})
    words = [str(w) for w in (parameters.get("comment"), extra.get("comment")) if w]
    extra["comment"] = " ".join([*words, TAG + token])
    return {**parameters, "comment": None, "additional_parameters": extra}


class SlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor whose sbatch carries a token and goes through hpc.slurm.cli.run."""

    def _submit_command(self, command: str) -> Any:
        token = secrets.token_hex(8)
        params, self.parameters = self.parameters, with_token(self.parameters, token)
        try:
            text = self._make_submission_file_text(command, token)
        finally:
            self.parameters = params
        script = utils.JobPaths.get_first_id_independent_folder(self.folder) / f".submission_file_{token}.sh"
        script.write_text(text)
        try:
            out = cli.run(self._make_submission_command(script), lookup=lookup(token))
        except RuntimeError as err:
            if "may have been queued" not in str(err):
                raise
            said = f"{err}: it carries the comment {TAG}{token} (squeue --me -o '%i %k')"
            raise (cli.SlurmExit(said, err.returncode) if isinstance(err, cli.SlurmExit) else RuntimeError(said)) from None
        job = self.job_class(folder=self.folder, job_id=self._get_job_id_from_submission_command(out),
                             tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(script, "submission_file", keep_as_symlink=True)
        return job
