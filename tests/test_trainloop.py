"""hpc.trainloop: stop on a signal, resume, and end bitwise equal to a clean run; the context
manager's exits; the stop step that gloo ranks agree on when only one of them is signalled."""

import json
import os
import signal

import pytest
from hypothesis import given, strategies as st
import torch

from hpc import ddp
from hpc.runtime import rng
from hpc.recovery.preemption import JobNotRequeued
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
        with TrainLoop(s, out_dir, save_every=save_every) as loop:
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
        with TrainLoop(s, out_dir, save_every=100) as loop:
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
        return seen, [p.detach().clone() for p in model.parameters()]


def test_loader_position_resumes_mid_epoch(tmp_path):
    clean_batches, clean = _train_on_loader(tmp_path / "clean")
    cut = tmp_path / "cut"
    with pytest.raises(JobNotRequeued):
        _train_on_loader(cut, stop_at=7)  # epoch 1, after its 2nd batch
    head = torch.load(cut / "checkpoints" / "step-7" / "shared.pt", weights_only=True)
    assert head["objects"]["data"] == {"epoch": 1, "samples": 8, "dataset": 20}  # global, shared
    rest, resumed = _train_on_loader(cut)
    assert len(rest) == TOTAL - 7
    assert all(torch.equal(a, b) for a, b in zip(rest, clean_batches[7:]))
    assert all(torch.equal(a, b) for a, b in zip(clean, resumed))


def _handlers():
    return signal.getsignal(signal.SIGUSR2), signal.getsignal(signal.SIGTERM)


def _count(loop, total, raise_at=None):
    """A step counter as the only state: the checkpoint's step says how far the loop got."""
    with loop:
        loop.resume({})
        for step in loop.steps(total):
            if step == raise_at:
                raise Crash(step)


def test_leaving_the_block_finishes_and_restores_the_handlers(tmp_path):
    before = _handlers()
    with ddp.session(env=None) as s:
        loop = TrainLoop(s, tmp_path, save_every=100, tensorboard=False)
        assert _handlers() != before
        _count(loop, 7)  # no finish() called: the exit writes the final checkpoint
    assert _handlers() == before
    assert loop.store.latest() == 7


def test_an_exception_exit_writes_no_final_checkpoint_but_lets_the_periodic_one_commit(tmp_path):
    """The state at the exception may be half a step: the newest consistent checkpoint stays."""
    before = _handlers()
    with ddp.session(env=None) as s:
        loop = TrainLoop(s, tmp_path, save_every=4, tensorboard=False)
        with pytest.raises(Crash):
            _count(loop, 20, raise_at=10)
    assert _handlers() == before
    assert loop.store.latest() == 8 and loop.store.steps() == [4, 8]


def test_finish_inside_the_block_is_not_repeated(tmp_path):
    with ddp.session(env=None) as s:
        with TrainLoop(s, tmp_path, save_every=100, tensorboard=False) as loop:
            loop.resume({})
            for _ in loop.steps(3):
                pass
            loop.finish()
            saves = loop.store.stats["saves"]
        assert loop.store.stats["saves"] == saves == 1


def test_only_one_rank_signalled_every_rank_stops_at_the_same_step(tmp_path):
    """Gloo ranks, one of them signalled at many moments (a given step's body, or a timer at an
    arbitrary point, with votes every 1, 2 or 3 steps, or paced by the step time): all stop at the
    same step, and for a signal inside step k that is the poll after the first poll at or after
    k; paced votes are at the same steps on every rank, spaced by the agreed pace."""
    from ddp_workload import stop_trial
    from test_ddp_session import results, run_local

    world, trials = 3, 24
    codes, _, errors = run_local("stop", world, tmp_path, "--steps", str(trials))
    assert codes == [0] * world, errors
    ranks = [r["stops"] for r in results(tmp_path, world)]
    for trial in range(trials):
        plan = stop_trial(trial, world)
        steps = {ranks[r][trial]["step"] for r in range(world)}
        assert len(steps) == 1, (plan, steps)
        assert [ranks[r][trial]["saw_signal"] for r in range(world)] == \
            [r == plan["rank"] for r in range(world)]
        step, every = steps.pop(), plan["check_every"]
        polls = [ranks[r][trial]["polls"] for r in range(world)]
        assert polls[0][-1][0] == step, (plan, polls[0])  # the stop is decided at a poll
        if every is None:
            _assert_paced(polls, plan)
        elif plan["timer_s"] is None:
            first_poll = -(-plan["step"] // every) * every
            assert step == first_poll + every, plan
        marker = tmp_path / f"trial-{trial}" / "checkpoints" / f"step-{step}" / "COMPLETE.json"
        assert json.loads(marker.read_text())["step"] == step


def _assert_paced(polls, plan):
    """Paced checks, whatever the step times were: every rank polls at the same steps and agrees
    on the same pace, the slowest rank's from the poll before; the next poll is as many steps on
    as check_interval gives for that pace."""
    from hpc.recovery.stopsignal import check_interval

    at = [[(step, agreed) for step, _, agreed in mine] for mine in polls]
    assert all(a == at[0] for a in at), (plan, at)
    sent = [max(mine[i][1] for mine in polls) for i in range(len(at[0]))]
    assert [agreed for _, agreed in at[0]] == [0] + sent[:-1], (plan, polls)
    for (step, agreed), (following, _) in zip(at[0], at[0][1:]):
        assert following == step + check_interval(agreed), (plan, at[0])


def _corrupt_shards(out_dir, steps):
    for step in steps:
        shard = out_dir / "checkpoints" / f"step-{step}" / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF  # inside a tensor's bytes: caught while it loads
        shard.write_bytes(bytes(data))


def test_a_corrupt_shard_found_while_loading_falls_back_to_the_older_checkpoint(tmp_path):
    expected, _ = _train(tmp_path / "ref")
    with pytest.raises(JobNotRequeued):
        _train(tmp_path / "run", stop_at=10)  # checkpoints at steps 5 and 10 (the stop)
    _corrupt_shards(tmp_path / "run", [10])
    params, loop = _train(tmp_path / "run")  # what step 10's failed load left is overwritten by 5's
    assert loop.resumed_step == 5 and all(torch.equal(a, b) for a, b in zip(params, expected))


def test_no_intact_checkpoint_after_a_partial_load_refuses_to_train_on(tmp_path):
    with pytest.raises(JobNotRequeued):
        _train(tmp_path, stop_at=10)
    _corrupt_shards(tmp_path, [5, 10])
    with pytest.raises(RuntimeError, match="overwritten part of the model.*HINT"):
        _train(tmp_path)


@given(st.integers(min_value=-10, max_value=10**10), st.floats(min_value=1e-3, max_value=10.0))
def test_check_interval_spaces_checks_by_the_period(pace_us, period_s):
    from hpc.recovery.stopsignal import MAX_CHECK_EVERY, check_interval

    n = check_interval(pace_us, period_s)
    assert 1 <= n <= MAX_CHECK_EVERY
    if pace_us <= 0:
        assert n == 1  # pace unknown: check at the next step
    elif 1 < n < MAX_CHECK_EVERY:  # as many steps as fit in the period, never more
        period_us = period_s * 1e6
        assert n * pace_us <= period_us * (1 + 1e-12) and period_us < (n + 1) * pace_us * (1 + 1e-12)


def test_a_stop_save_of_an_optimizer_that_keeps_no_state_takes_no_step(tmp_path):
    """TrainLoop watches its optimizer from resume() on: the stop's save of plain SGD neither
    steps it nor leaves a gradient behind, and the run resumes from that save."""
    with ddp.session(env=None) as s:
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with TrainLoop(s, tmp_path, save_every=100, tensorboard=False) as loop:
            loop.resume({"model": model, "optimizer": opt})
            for _ in loop.steps(3):
                model(torch.randn(5, 4)).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            taken = []
            opt.register_step_pre_hook(lambda *_: taken.append(1))
            loop.finish()
        assert taken == [] and all(p.grad is None for p in model.parameters())
        again = torch.nn.Linear(4, 2)
        fresh = torch.optim.SGD(again.parameters(), lr=0.1)
        with TrainLoop(s, tmp_path, save_every=100, tensorboard=False) as loop:
            assert loop.resume({"model": again, "optimizer": fresh}) == 3
        assert torch.equal(again.weight, model.weight) and torch.equal(again.bias, model.bias)
