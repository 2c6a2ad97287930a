"""Submissions announced before sbatch (hpc.rundir.intents) and the jobs found by their token
(hpc.monitor.lost), on plain files and dicts: no SLURM.

    python -m pytest tests/test_lost.py
"""
from pathlib import Path

from hpc.monitor import lost
from hpc.rundir import intents
from hpc.rundir.run import RunDir
from hpc.slurm import tokens


def test_squeue_lines_give_each_token_its_job():
    out = "41|hpc:aa11\n42|my run hpc:bb22\n43|hpc:cc33\n43|hpc:cc33\n44|(null)\n|hpc:dd44\n45|hpc:\n"
    assert tokens.parse(out) == {"aa11": "41", "bb22": "42", "cc33": "43"}


def test_an_announcement_lives_until_it_is_dropped(tmp_path):
    intents.announce(tmp_path, "aa11", "second", [0, 1], intents.id_suffixes([3, 5], True), ["7"], [["6_3"], []])
    (entry,) = intents.pending(tmp_path)
    assert entry["items"] == [0, 1] and intents.job_ids(entry, "12") == ["12_3", "12_5"]
    assert intents.id_suffixes([0], False) == [""]
    intents.drop(tmp_path, ["aa11"])
    assert intents.pending(tmp_path) == []


def test_a_job_found_by_its_token_joins_the_manifest_once_with_its_folder_and_pickle(tmp_path):
    run = RunDir(tmp_path / "run")
    run.start("tiny", "{}\n", "slurm", planned=[("first", None), ("second", 0), ("second", 1)])
    pickle = tmp_path / "run" / "first" / "logs" / "abc.pkl"
    pickle.parent.mkdir(parents=True)
    pickle.write_bytes(b"p")
    logs = str(tmp_path / "run" / "first" / "logs" / "%j")
    intents.announce(run.path, "aa11", "first", [None], [""], [], [], None, logs, (str(pickle), f"{logs}/%j_submitted.pkl"))
    intents.announce(run.path, "bb22", "second", [0, 1], ["_0", "_1"], ["12"], [], None, logs.replace("%j", "%A"))
    data = run.manifest()
    pending = intents.pending(run.path)
    assert lost.adopt({"tasks": {}}, pending, {"aa11": "12"}, move=False) == ["aa11"]  # a status: a copy
    assert pickle.exists() and (tmp_path / "run" / "first" / "logs" / "12" / "12_submitted.pkl").exists()
    assert lost.adopt(data, pending, {"aa11": "12"}) == ["aa11"]
    assert lost.adopt(data, pending, {"aa11": "12"}) == ["aa11"]  # recorded already: not added twice
    run.write_manifest(data)
    (task,) = RunDir(run.path).tasks()
    assert task["job_id"] == "12" and len(task["jobs"]) == 1 and task["jobs"][0]["found_by_token"] == "aa11"
    assert (tmp_path / "run" / "first" / "logs" / "12" / "12_submitted.pkl").read_bytes() == b"p"
    assert not pickle.exists()  # a resubmission moves it
    assert RunDir(run.path).unsubmitted() == [("second", 0), ("second", 1)]


def test_a_sweep_announcement_is_cut_into_one_per_point():
    entry = {"token": "aa11", "stage": "first", "items": [["p1", None], ["p2", None], ["p1", 3]],
             "ids": ["_0", "_1", "_2"], "after": {"p1": ["7"]}, "each": [[], ["8_1"], []]}
    parts = lost._by_point([entry])
    assert [(p["items"], p["ids"], p["after"], p["each"]) for p in parts["p1"]] == [([None, 3], ["_0", "_2"], ["7"],
                                                                                    [[], []])]
    assert [(p["items"], p["ids"], p["after"], p["each"]) for p in parts["p2"]] == [([None], ["_1"], [], [["8_1"]])]


def test_submitit_names_a_jobs_pickle_before_its_sbatch(tmp_path):
    """The contract hpc.pipeline.submitonce relies on: submitit pickles one job (set_timeout, dump)
    before it calls _submit_command, and moves that very file once the job id is known."""
    import submitit

    from hpc.pipeline.submitonce import SlurmExecutor

    seen = {}

    class Probe(SlurmExecutor):
        def _submit_command(self, command):
            seen["pickle"] = self._pickle and Path(self._pickle).read_bytes()
            return submitit.SlurmJob(folder=self.folder, job_id="12", tasks=[0])

    executor = Probe(folder=str(tmp_path / "%j"))
    executor.intent = object()  # any Intent: only whether there is one counts here
    executor.submit(print, "x")
    assert seen["pickle"] == (tmp_path / "12" / "12_submitted.pkl").read_bytes() and executor._pickle is None
