"""hpc.trainloop in one process: stop on a signal, resume, and end bitwise equal to a clean run."""

import os
import signal

import pytest
import torch

from hpc import ddp, rng
from hpc.preemption import JobNotRequeued
from hpc.trainloop import TrainLoop

TOTAL = 12


class Crash(Exception):
    pass


def _train(out_dir, stop_at=None, save_every=5, crash_at=None):
    """Noisy SGD (dropout + random batches) so that RNG state matters for the result."""
    with ddp.session(env=None) as s:
        rng.seed_all(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        loop = TrainLoop(s, out_dir, save_every=save_every)
        loop.resume({"model": model, "optimizer": opt, "scheduler": sched})
        for step in loop.steps(TOTAL):
            x = torch.randn(16, 4)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            loop.log("loss", loss.item())
            if step == crash_at:
                loop.writer.flush()
                loop.store.wait()  # the step-5 checkpoint is on disk before the crash
                raise Crash(step)
            if step == stop_at:
                os.kill(os.getpid(), signal.SIGUSR2)  # handled at the step boundary
        loop.finish()
        return [p.detach().clone() for p in model.parameters()], loop


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)


def test_first_run_starts_fresh_and_stop_resume_is_bitwise_identical(tmp_path):
    clean, loop = _train(tmp_path / "clean")
    assert loop.resumed_step == 0 and loop.store.latest() == TOTAL
    with pytest.raises(JobNotRequeued, match="not running under SLURM"):
        _train(tmp_path / "cut", stop_at=7)
    assert (tmp_path / "cut" / "checkpoints" / "step-7").is_dir()
    resumed, loop = _train(tmp_path / "cut")
    assert loop.resumed_step == 7
    assert all(torch.equal(a, b) for a, b in zip(clean, resumed))


def test_tensorboard_has_no_duplicated_points_after_a_crash(tmp_path):
    """Crash at step 8 with the newest checkpoint at 5: steps 6-8 are logged twice on disk, and
    purge_step makes TensorBoard keep only the second attempt's points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with pytest.raises(Crash):
        _train(tmp_path, crash_at=8, save_every=5)
    _, loop = _train(tmp_path)
    assert loop.resumed_step == 5
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == list(range(1, TOTAL + 1))


def _train_on_loader(out_dir, stop_at=None):
    """Batches from s.loader (5 per epoch): the resumed run must continue mid-epoch."""
    seen = []
    with ddp.session(env=None) as s:
        rng.seed_all(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = s.loader(torch.randn(20, 4), batch_size=4, seed=1)
        loop = TrainLoop(s, out_dir, save_every=100)
        loop.resume({"model": model, "optimizer": opt, "data": loader})
        batches = loader.batches()
        for step in loop.steps(TOTAL):
            x = next(batches)
            seen.append(x.clone())
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == stop_at:
                os.kill(os.getpid(), signal.SIGUSR2)
        loop.finish()
        return seen, [p.detach().clone() for p in model.parameters()]


def test_loader_position_resumes_mid_epoch(tmp_path):
    clean_batches, clean = _train_on_loader(tmp_path / "clean")
    cut = tmp_path / "cut"
    with pytest.raises(JobNotRequeued):
        _train_on_loader(cut, stop_at=7)  # epoch 1, after its 2nd batch
    head = torch.load(cut / "checkpoints" / "step-7" / "rank-0.pt", weights_only=True)
    assert head["objects"]["data"] == {"epoch": 1, "consumed": 8, "num_samples": 20}
    rest, resumed = _train_on_loader(cut)
    assert len(rest) == TOTAL - 7
    assert all(torch.equal(a, b) for a, b in zip(rest, clean_batches[7:]))
    assert all(torch.equal(a, b) for a, b in zip(clean, resumed))
