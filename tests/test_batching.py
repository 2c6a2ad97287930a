import math

import pytest
from hypothesis import given, strategies as st

from hpc.runtime.batching import plan_batch, scale_lr


@pytest.mark.parametrize("world, micro, accum", [(1, 16, 4), (2, 16, 2), (4, 16, 1), (8, 8, 1)])
def test_same_effective_batch_on_1_2_4_8_devices(world, micro, accum):
    plan = plan_batch(global_batch=64, per_device_max=16, world_size=world)
    assert (plan.micro_batch, plan.accum_steps) == (micro, accum)
    assert plan.micro_batch * plan.accum_steps * plan.world_size == 64


def test_uneven_share_picks_a_divisor():
    plan = plan_batch(24, per_device_max=5, world_size=2)  # 12 per device, 5 max -> 4 x 3
    assert (plan.micro_batch, plan.accum_steps) == (4, 3)


@given(g=st.integers(1, 512), m=st.integers(1, 64), w=st.sampled_from([1, 2, 3, 4, 8]))
def test_plan_is_exact_and_fits(g, m, w):
    if g % w:
        with pytest.raises(ValueError, match="HINT"):
            plan_batch(g, m, w)
        return
    plan = plan_batch(g, m, w)
    assert plan.micro_batch <= m
    assert plan.micro_batch * plan.accum_steps * w == g
    assert plan.accum_steps >= math.ceil(g // w / m)


def test_sync_only_on_last_micro_step():
    plan = plan_batch(64, 16, 1)
    assert [plan.sync_step(i) for i in range(8)] == [False, False, False, True] * 2


def test_uneven_global_batch_suggests_multiples():
    with pytest.raises(ValueError, match=r"e\.g\. 8 or 12"):
        plan_batch(10, 4, 4)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_rejects_non_positive(bad):
    with pytest.raises(ValueError, match="positive integer"):
        plan_batch(64, bad, 2)


def test_lr_rules():
    assert scale_lr(1e-3, 32, 128, "none") == 1e-3
    assert scale_lr(1e-3, 32, 128, "linear") == pytest.approx(4e-3)
    assert scale_lr(1e-3, 32, 128, "sqrt") == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="expected one of"):
        scale_lr(1e-3, 32, 128, "cubic")


@given(g=st.integers(1, 512), w=st.integers(2, 64))
def test_an_uneven_global_batch_is_refused_naming_distinct_multiples_that_split(g, w):
    if g % w == 0:
        return
    with pytest.raises(ValueError) as err:
        plan_batch(g, 8, w)
    hint = str(err.value).split("HINT: ")[1]
    suggested = [int(word) for word in hint.replace(",", " ").split() if word.isdigit()]
    multiples = suggested[1:]  # the first number is the world size itself
    assert multiples and all(m % w == 0 and m > 0 for m in multiples) and len(set(multiples)) == len(multiples)
