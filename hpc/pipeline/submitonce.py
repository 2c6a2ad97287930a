"""sbatch exactly once: each submission carries a token of its own, and a lost answer is looked up by it.

    python -c "from hpc.pipeline import submitonce; print(submitonce.find_token('41|hpc:ab12', 'ab12'))"

A busy controller can queue a job and still fail to answer sbatch (`Socket timed out on send/recv
operation`): asking again would queue it twice. So every sbatch hpc makes through submitit carries
`--comment=hpc:<token>` (a fresh token per sbatch, after the job's own comment if it has one), and
runs through hpc.slurm.cli.run; only when sbatch fails in a way that may have queued the job does
cli.run call `lookup`, one `squeue -h -t all --me -o '%F|%k'` (hpc.slurm.tokens), which returns the
job (an array's first job id, %F, as sbatch printed it) carrying the token, and sbatch is asked
again only when none does. With nothing failing, no scheduler call is added.

An executor given an Intent (hpc.pipeline.launcher's recorder of a job) tells it the token before
sbatch runs, so the run directory holds it even when the answer and the look-up both fail or the
process is killed before it writes the job id (hpc.rundir.intents); and that sbatch certainly
queued nothing (a refusal whose words say the request never acted), so that the token is dropped.

SlurmExecutor is submitit's with the one method that runs sbatch (_submit_command) going through
hpc.slurm.cli.run: executor.submit, executor.batch() and hpc.pipeline.executor.submit_array use it.
"""
from __future__ import annotations

import secrets
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

import submitit
from submitit.core import utils

from hpc.slurm import cli, retry, tokens
from hpc.slurm.tokens import TAG  # noqa: F401 (re-exported)
from hpc.slurm.tokens import find as find_token  # noqa: F401 (re-exported)


class Intent(Protocol):
    def before(self, token: str, pickle: Optional[Tuple[str, str]]) -> None:
        """Record `token` before the sbatch carrying it runs; `pickle`: a job's own (where submitit
        wrote it, where the job reads it, %j standing for its id), which it moves once sbatch answers."""

    def refused(self, token: str) -> None:
        """The sbatch carrying `token` queued nothing: forget it."""


def lookup(token: str) -> Callable[[], Optional[str]]:
    """cli.run's `lookup` for an sbatch carrying `token`: sbatch's lost answer when the job is queued."""
    def queued() -> Optional[str]:
        found = tokens.find(tokens.queued(), token)
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
    """submitit's SlurmExecutor whose sbatch carries a token and goes through hpc.slurm.cli.run;
    `intent` (None: none) hears of each token before its sbatch runs."""

    intent: Optional[Intent] = None
    _pickle: Optional[str] = None  # where submitit pickled the one job being submitted

    def _internal_process_submissions(self, delayed_submissions: List[Any]) -> List[Any]:
        # one job: submitit pickles it under a temporary name and moves it into the job's folder once
        # sbatch answers; the name goes into the announcement, so that a job found by its token gets it
        if self.intent is not None and len(delayed_submissions) == 1:
            delayed_submissions = [_Noted(delayed_submissions[0], self)]
        try:
            return super()._internal_process_submissions(delayed_submissions)
        finally:
            self._pickle = None

    def _submit_command(self, command: str) -> Any:
        token = secrets.token_hex(8)
        params, self.parameters = self.parameters, with_token(self.parameters, token)
        try:
            text = self._make_submission_file_text(command, token)
        finally:
            self.parameters = params
        script = utils.JobPaths.get_first_id_independent_folder(self.folder) / f".submission_file_{token}.sh"
        script.write_text(text)
        if self.intent is not None:
            reads = str(utils.JobPaths(self.folder).submitted_pickle)  # %j left in
            self.intent.before(token, (self._pickle, reads) if self._pickle else None)
        try:
            out = cli.run(self._make_submission_command(script), lookup=lookup(token))
        except RuntimeError as err:
            if self.intent is not None and not retry.may_have_acted(str(err)):  # a refusal: nothing queued
                self.intent.refused(token)
            if "may have been queued" not in str(err):
                raise
            said = f"{err}: it carries the comment {TAG}{token} (squeue --me -o '%i %k')"
            raise (cli.SlurmExit(said, err.returncode) if isinstance(err, cli.SlurmExit) else RuntimeError(said)) from None
        job = self.job_class(folder=self.folder, job_id=self._get_job_id_from_submission_command(out),
                             tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(script, "submission_file", keep_as_symlink=True)
        return job


class _Noted:
    """A job's DelayedSubmission whose pickle's path its executor notes (submitit calls only these two)."""

    def __init__(self, delayed: Any, executor: SlurmExecutor):
        self.delayed, self.executor = delayed, executor

    def set_timeout(self, *args: Any) -> None:
        self.delayed.set_timeout(*args)

    def dump(self, path: Any) -> None:
        self.delayed.dump(path)
        self.executor._pickle = str(path)
