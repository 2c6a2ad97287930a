"""Unit tests for hpc.rng: capture/restore repeats every generator's draws exactly."""

import io
import random

import numpy as np
import pytest
import torch

from hpc import rng


def _draws():
    return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(),
            np.random.randn(), torch.rand(4).tolist(), torch.randn(2).tolist())


def test_restore_repeats_all_generators():
    rng.seed_all(123)
    _draws()  # move away from the seed so restore is not just reseeding
    state = rng.capture()
    first = _draws()
    _draws()
    rng.restore(state)
    assert _draws() == first


def test_state_survives_weights_only_load():
    rng.seed_all(7)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    state = rng.capture()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    expected = _draws()
    rng.restore(loaded)
    assert _draws() == expected


def test_seed_all_is_deterministic_and_seed_sensitive():
    rng.seed_all(5)
    a = _draws()
    rng.seed_all(5)
    assert _draws() == a
    rng.seed_all(6)
    assert _draws() != a


def test_cpu_only_process_has_no_cuda_state():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert rng.capture()["cuda"] is None


def test_unknown_source_is_rejected_with_hint():
    with pytest.raises(ValueError, match="HINT"):
        rng.restore({"jax": 1})
