"""Fixtures of the GPU suite: each test body runs on the CPU here (gloo) and on cuda:0 (NCCL) where
CUDA is, so the logic of every check is proven on any machine and the device paths run on a GPU.

    python -m pytest -n 0 tests/gpu           # here: the CPU variants pass, the CUDA ones are skipped
    python -m bench.gpu                       # on a GPU machine: the suite and the GPU benchmarks

Every CUDA variant is skipped for one reason, onerank.NO_CUDA; checks that need two GPUs for
onerank.NO_TWO_GPUS (marks.py).
"""

from __future__ import annotations

import pytest
import torch
from marks import KINDS
from onerank import one_rank_group


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    """"cpu" or "cuda": where the test body runs."""
    return request.param


@pytest.fixture
def group(kind):
    """A one-rank default process group for `kind` (NCCL on cuda:0, gloo on the CPU): (device, backend)."""
    with one_rank_group(kind) as (device, backend):
        yield device, backend


@pytest.fixture(autouse=True)
def tf32_as_it_was():
    """hpc.ddp.session sets TF32 process-wide (on by default): every test starts from the same switches."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
